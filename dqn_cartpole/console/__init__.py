"""What the terminal shows: the progress line, stop signals, and the filter that keeps native log noise off it."""
