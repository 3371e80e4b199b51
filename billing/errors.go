package billing

import "errors"

// Domain errors. Callers test them with errors.Is; package api maps them to
// status codes (all of them are the caller's fault: InvalidArgument or
// FailedPrecondition).
var (
	// ErrInvalidMoney: a money amount that is not a decimal of the accepted
	// grammar (see ParseMoney).
	ErrInvalidMoney = errors.New("invalid money amount")
	// ErrInvalidWeight: a weight that is not a non-negative decimal.
	ErrInvalidWeight = errors.New("invalid weight")
	// ErrOutOfRange: an amount, parsed or computed, outside the range of
	// Money (about ±9.2 billion units).
	ErrOutOfRange = errors.New("amount out of range")

	// ErrInvalidPriceBook is wrapped by every error of ParsePriceBook and
	// PriceBook.Validate, next to the specific one below.
	ErrInvalidPriceBook = errors.New("invalid price book")
	// ErrMissingField: a required field is absent or empty.
	ErrMissingField = errors.New("missing field")
	// ErrInvalidField: a field has a value of the wrong form (a time that is
	// not RFC 3339, a name with forbidden characters, a currency code that is
	// not three upper-case letters).
	ErrInvalidField = errors.New("invalid field")
	// ErrNegativePrice: a price below zero.
	ErrNegativePrice = errors.New("negative price")
	// ErrDuplicatePrice: two entries with the same key and effective_from,
	// which would make the price in force ambiguous.
	ErrDuplicatePrice = errors.New("duplicate price")
	// ErrUnknownPolicy: a busy or idle policy name that is not one of the
	// Busy* or Idle* constants, or weights that make a policy meaningless.
	ErrUnknownPolicy = errors.New("unknown policy")

	// ErrInvalidUsage: GPU usage or tenant usage that cannot be costed
	// (negative or non-finite seconds, a MIG fraction outside (0, 1],
	// negative tokens, cached tokens above input tokens, a missing, repeated
	// or reserved tenant name).
	ErrInvalidUsage = errors.New("invalid usage")
	// ErrZeroWeights: Allocate was asked to split a non-zero amount over
	// weights that are all zero.
	ErrZeroWeights = errors.New("allocation weights sum to zero")
)

// FieldError is one problem of a price book at a path such as
// "gpu_prices[3].per_hour". PriceBook.Validate and ParsePriceBook join every
// FieldError they find with errors.Join. errors.Is matches both
// ErrInvalidPriceBook and the specific error in Err.
type FieldError struct {
	// Path locates the field, in the JSON names of the price book file.
	Path string
	// Err is the problem; it wraps one of the Err* values.
	Err error
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Err.Error() }

// Unwrap returns ErrInvalidPriceBook and the specific error.
func (e *FieldError) Unwrap() []error { return []error{ErrInvalidPriceBook, e.Err} }
