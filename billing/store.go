package billing

import (
	"context"
	"fmt"
	"time"
)

// PriceBookStore keeps versioned price books (canonical JSON by version);
// *chstore.Store implements it.
type PriceBookStore interface {
	CurrentPriceBook(ctx context.Context) (version, book string, createdAt time.Time, ok bool, err error)
	PutPriceBook(ctx context.Context, version, book, source string, at time.Time) error
}

// EnsurePriceBook makes book the price book in force, storing it as a new
// version when it differs from the newest stored one. It returns the version
// in force and whether it was stored now. source records where the book
// came from (a file name, "api:<key name>").
func EnsurePriceBook(ctx context.Context, store PriceBookStore, book *PriceBook, source string, now time.Time) (string, bool, error) {
	if err := book.Validate(); err != nil {
		return "", false, err
	}
	data, err := book.MarshalJSON()
	if err != nil {
		return "", false, fmt.Errorf("encode price book: %w", err)
	}
	version := book.Version()
	current, _, _, ok, err := store.CurrentPriceBook(ctx)
	if err != nil {
		return "", false, err
	}
	if ok && current == version {
		return version, false, nil
	}
	if err := store.PutPriceBook(ctx, version, string(data), source, now); err != nil {
		return "", false, err
	}
	return version, true, nil
}

// EmptyPriceBook is the book in force before any is stored: no prices, so
// every GPU-second is reported unpriced (never priced at zero).
func EmptyPriceBook() *PriceBook {
	return &PriceBook{Currency: DefaultCurrency, Allocation: DefaultPolicy()}
}

// BookReader reads the price book in force; *chstore.Store implements it.
type BookReader interface {
	CurrentPriceBook(ctx context.Context) (version, book string, createdAt time.Time, ok bool, err error)
}

// BookInForce is the price book in force in store; without one, the empty
// book (every amount is then unpriced, never priced at zero).
func BookInForce(ctx context.Context, store BookReader) (*PriceBook, error) {
	_, doc, _, ok, err := store.CurrentPriceBook(ctx)
	if err != nil {
		return nil, err
	}
	if !ok {
		return EmptyPriceBook(), nil
	}
	book, err := ParsePriceBook([]byte(doc))
	if err != nil {
		return nil, fmt.Errorf("stored price book: %w", err)
	}
	return book, nil
}
