package billing

import (
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

func TestParseMoney(t *testing.T) {
	tests := []struct {
		in   string
		want Money
		str  string // String() of the result
	}{
		{"0", 0, "0"},
		{"-0", 0, "0"},
		{"12", 12_000_000_000, "12"},
		{"12.345", 12_345_000_000, "12.345"},
		{"12.345000000", 12_345_000_000, "12.345"},
		{"4.10", 4_100_000_000, "4.1"},
		{"0.000000001", 1, "0.000000001"},
		{"-0.000000001", -1, "-0.000000001"},
		{"-3.5", -3_500_000_000, "-3.5"},
		{"007.5", 7_500_000_000, "7.5"},
		{"9223372036.854775807", math.MaxInt64, "9223372036.854775807"},
		{"-9223372036.854775807", -math.MaxInt64, "-9223372036.854775807"},
		{"0000000000000000009223372036.854775807", math.MaxInt64, "9223372036.854775807"},
	}
	for _, tt := range tests {
		got, err := ParseMoney(tt.in)
		if err != nil {
			t.Errorf("ParseMoney(%q): %v", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseMoney(%q) = %d, want %d", tt.in, got, tt.want)
		}
		if s := got.String(); s != tt.str {
			t.Errorf("ParseMoney(%q).String() = %q, want %q", tt.in, s, tt.str)
		}
	}
}

func TestParseMoneyErrors(t *testing.T) {
	tests := []struct {
		in   string
		want error
	}{
		{"", ErrInvalidMoney},
		{"-", ErrInvalidMoney},
		{".5", ErrInvalidMoney},
		{"5.", ErrInvalidMoney},
		{"1.0000000001", ErrInvalidMoney}, // 10 decimals: never rounded
		{"1e3", ErrInvalidMoney},
		{"1E3", ErrInvalidMoney},
		{"+1", ErrInvalidMoney},
		{"--1", ErrInvalidMoney},
		{" 1", ErrInvalidMoney},
		{"1 ", ErrInvalidMoney},
		{"1,000.00", ErrInvalidMoney},
		{"1_000", ErrInvalidMoney},
		{"0x10", ErrInvalidMoney},
		{"NaN", ErrInvalidMoney},
		{"Inf", ErrInvalidMoney},
		{"1.2.3", ErrInvalidMoney},
		{"١", ErrInvalidMoney}, // a non-ASCII digit
		{"9223372036.854775808", ErrOutOfRange},
		{"-9223372036.854775808", ErrOutOfRange}, // MinInt64 is not a valid Money
		{"10000000000", ErrOutOfRange},
		{"99999999999999999999999", ErrOutOfRange},
	}
	for _, tt := range tests {
		got, err := ParseMoney(tt.in)
		if !errors.Is(err, tt.want) {
			t.Errorf("ParseMoney(%q) = %v, %v; want error %v", tt.in, got, err, tt.want)
		}
		if !errors.Is(err, ErrInvalidMoney) {
			t.Errorf("ParseMoney(%q) error %v does not wrap ErrInvalidMoney", tt.in, err)
		}
	}
}

func TestMoneyRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	values := []Money{0, 1, -1, 999_999_999, 1_000_000_000, -1_000_000_001, math.MaxInt64, -math.MaxInt64}
	for range 10_000 {
		v := Money(rng.Int64())
		if rng.IntN(2) == 0 {
			v = -v
		}
		if rng.IntN(3) == 0 {
			v %= 1_000_000_000_000
		}
		values = append(values, v)
	}
	for _, v := range values {
		s := v.String()
		got, err := ParseMoney(s)
		if err != nil || got != v {
			t.Fatalf("ParseMoney(%d.String() = %q) = %d, %v", v, s, got, err)
		}
		text, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var back Money
		if err := json.Unmarshal(text, &back); err != nil || back != v {
			t.Fatalf("JSON round trip of %d via %s = %d, %v", v, text, back, err)
		}
	}
}

func TestMoneyJSON(t *testing.T) {
	type row struct {
		Cost Money `json:"cost"`
	}
	got, err := json.Marshal(row{Cost: 1_250_000_000})
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != `{"cost":"1.25"}` {
		t.Errorf("got %s, want {\"cost\":\"1.25\"}", got)
	}
	var r row
	if err := json.Unmarshal([]byte(`{"cost":1.25}`), &r); err == nil {
		t.Errorf("a JSON number decoded as money: %v", r.Cost)
	}
	if err := json.Unmarshal([]byte(`{"cost":"1e3"}`), &r); !errors.Is(err, ErrInvalidMoney) {
		t.Errorf("got %v, want ErrInvalidMoney", err)
	}
}

func TestMoneyStringFixed(t *testing.T) {
	tests := []struct {
		m      Money
		places int
		want   string
	}{
		{4_100_000_000, 2, "4.10"},
		{4_105_000_000, 2, "4.10"}, // half to even
		{4_115_000_000, 2, "4.12"},
		{4_105_000_001, 2, "4.11"},
		{-4_105_000_000, 2, "-4.10"},
		{-4_115_000_000, 2, "-4.12"},
		{2_500_000_000, 0, "2"},
		{3_500_000_000, 0, "4"},
		{1, 9, "0.000000001"},
		{1, 2, "0.00"},
		{-5_000_000, 2, "0.00"}, // no negative zero
	}
	for _, tt := range tests {
		if got := tt.m.StringFixed(tt.places); got != tt.want {
			t.Errorf("Money(%d).StringFixed(%d) = %q, want %q", tt.m, tt.places, got, tt.want)
		}
	}
}

func TestParseWeight(t *testing.T) {
	if w, err := ParseWeight("3"); err != nil || w != 3_000_000_000 {
		t.Errorf("ParseWeight(3) = %d, %v", w, err)
	}
	for _, s := range []string{"-1", "1e2", "", "0.1234567891"} {
		if _, err := ParseWeight(s); !errors.Is(err, ErrInvalidWeight) {
			t.Errorf("ParseWeight(%q): got %v, want ErrInvalidWeight", s, err)
		}
	}
}

func TestRoundRat(t *testing.T) {
	tests := []struct {
		num, den int64
		want     int64
	}{
		{5, 2, 2}, {7, 2, 4}, {-5, 2, -2}, {-7, 2, -4}, {1, 3, 0}, {2, 3, 1}, {-2, 3, -1}, {-1, 3, 0}, {10, 1, 10},
	}
	for _, tt := range tests {
		got := roundRat(big.NewRat(tt.num, tt.den))
		if got.Int64() != tt.want {
			t.Errorf("roundRat(%d/%d) = %s, want %d", tt.num, tt.den, got, tt.want)
		}
		if g := roundDivHalfEven(tt.num, tt.den); g != tt.want {
			t.Errorf("roundDivHalfEven(%d, %d) = %d, want %d", tt.num, tt.den, g, tt.want)
		}
	}
}

func FuzzParseMoney(f *testing.F) {
	for _, s := range []string{"0", "12.345", "-0.000000001", "1e3", "9223372036.854775807", ".5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMoney(s)
		if err != nil {
			return
		}
		back, err := ParseMoney(m.String())
		if err != nil || back != m {
			t.Fatalf("ParseMoney(%q) = %d; String %q parses to %d, %v", s, m, m.String(), back, err)
		}
		// The value is the exact decimal: compare with big.Rat.
		want, ok := new(big.Rat).SetString(s)
		if !ok {
			t.Fatalf("ParseMoney accepted %q, which big.Rat rejects", s)
		}
		got := new(big.Rat).SetFrac64(int64(m), 1_000_000_000)
		if got.Cmp(want) != 0 {
			t.Fatalf("ParseMoney(%q) = %s, want %s", s, got.FloatString(9), want.FloatString(9))
		}
	})
}
