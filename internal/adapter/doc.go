// Package adapter holds no code: its subpackages connect tokenmeter's
// domain (ingest, query, rollup, billing) to the engines it runs on.
//
//   - chstore: ClickHouse. It implements the ports the domain declares
//     (ingest.EventWriter and the rows of ingest/sink, rollup.Store,
//     query.Source) and owns the schema and the SQL.
//   - kafkaconn: how every Kafka client connects (TLS, SASL).
//   - kafkalock: named locks over a Kafka consumer group (the rollup
//     lease).
//   - devenv: the engines of meterd --dev and of the tests (an in-process
//     Kafka broker, a private clickhouse-server).
//
// Storage imports point from the adapters to the domain: a domain package
// declares the small interfaces and records it needs, and chstore imports
// it to implement them. No domain package depends on chstore, devenv or a
// test kit (internal/testkit); layering_test.go holds that. Kafka is the
// exception: ingest and rollup read and write Kafka themselves (kafka-go)
// and take their connection settings (TLS, SASL) from kafkaconn.
package adapter
