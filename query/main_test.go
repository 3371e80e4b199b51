package query_test

import (
	"testing"
	"time"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/chtest"
	"tokenmeter/query"
)

func TestMain(m *testing.M) { chtest.Main(m) }

// reads is the read side over s.
func reads(s *chstore.Store) *query.Service { return query.New(s, query.Config{}) }

// day is the day the tests' events happen on.
var day = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
