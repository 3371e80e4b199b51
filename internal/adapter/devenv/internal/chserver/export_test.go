package chserver

// ProcessAlive exposes processAlive to the external tests: an orphaned
// server that was killed may linger as a zombie until init reaps it.
var ProcessAlive = processAlive
