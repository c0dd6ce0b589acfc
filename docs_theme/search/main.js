// The site's search, for a site opened as files (file://) as well as served over HTTP. mkdocs' own search/main.js
// starts a Web Worker and fetches search_index.json with XMLHttpRequest; a browser refuses both to a page opened from
// file://, so its search stayed at "Searching...". This one loads lunr.js and the index as plain scripts (the index
// as search/search_index.js, which docs_theme/hooks.py writes from search_index.json after each build), builds the
// index in the page, and only on the search page: the other pages' search box submits to it.
(function () {
  "use strict";

  function joinUrl(base, path) {
    return base.charAt(base.length - 1) === "/" ? base + path : base + "/" + path;
  }

  function escapeHtml(value) {
    return value.replace(/&/g, "&amp;").replace(/"/g, "&quot;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function termFromLocation() {
    var pairs = window.location.search.substring(1).split("&");
    for (var i = 0; i < pairs.length; i++) {
      var pair = pairs[i].split("=");
      if (pair[0] === "q" && pair.length > 1) {
        return decodeURIComponent(pair[1].replace(/\+/g, "%20"));
      }
    }
    return "";
  }

  function loadScript(src, done, failed) {
    var script = document.createElement("script");
    script.src = src;
    script.onload = done;
    script.onerror = failed;
    document.head.appendChild(script);
  }

  function show(results, box, documents) {
    box.innerHTML = "";
    if (!results.length) {
      box.insertAdjacentHTML("beforeend", "<p>" + escapeHtml(box.getAttribute("data-no-results-text") ||
                                                             "No results found") + "</p>");
      return;
    }
    results.forEach(function (result) {
      var doc = documents[result.ref];
      box.insertAdjacentHTML("beforeend", '<article><h3><a href="' + joinUrl(base_url, doc.location) + '">' +
                             escapeHtml(doc.title) + "</a></h3><p>" + escapeHtml(doc.text.substring(0, 200)) +
                             "</p></article>");
    });
  }

  function buildIndex(data, documents) {
    if (data.config && data.config.separator) {
      lunr.tokenizer.separator = new RegExp(data.config.separator);
    }
    return lunr(function () {
      this.field("title");
      this.field("text");
      this.ref("location");
      data.docs.forEach(function (doc) {
        documents[doc.location] = doc;
        this.add(doc);
      }, this);
    });
  }

  function start(input, box) {
    var data = window.mkdocs_search_index, documents = {};
    var index = buildIndex(data, documents);
    var shortest = (data.config && data.config.min_search_length) || 3;
    function search() {
      var query = input.value.trim();
      if (query.length < shortest) {
        box.innerHTML = "";
        return;
      }
      var results;
      try {
        results = index.search(query);
      } catch (error) {  // lunr's query syntax (a lone "+", a "~" without a number): search the words alone
        results = index.search(query.replace(/[+\-~^:*]/g, " "));
      }
      show(results, box, documents);
    }
    input.addEventListener("keyup", search);
    input.value = termFromLocation();
    search();
  }

  function init() {
    var input = document.getElementById("mkdocs-search-query");
    var box = document.getElementById("mkdocs-search-results");
    if (!input || !box) {
      return;  // not the search page
    }
    function failed() {
      box.innerHTML = "<p>The search index did not load: build the site again with make docs.</p>";
    }
    loadScript(joinUrl(base_url, "search/lunr.js"), function () {
      loadScript(joinUrl(base_url, "search/search_index.js"), function () { start(input, box); }, failed);
    }, failed);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
