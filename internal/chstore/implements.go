package chstore

import (
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// The store implements what the rollup job and the read side declare they
// need.
var (
	_ rollup.Store = (*Store)(nil)
	_ query.Source = (*Store)(nil)
)
