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
	// The capacity report's freshness check of the deployment level.
	_ query.LevelVersionSource = (*Store)(nil)
)
