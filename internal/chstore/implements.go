package chstore

import "tokenmeter/rollup"

// The store implements what the rollup job declares it needs.
var _ rollup.Store = (*Store)(nil)
