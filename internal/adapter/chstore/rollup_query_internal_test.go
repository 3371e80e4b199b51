package chstore

import (
	"slices"
	"testing"
)

func TestParseArray(t *testing.T) {
	keys, err := parseArray[int16]("[-345,0,17,1152]", 16)
	if err != nil || !slices.Equal(keys, []int16{-345, 0, 17, 1152}) {
		t.Errorf("keys = %v, %v", keys, err)
	}
	counts, err := parseArray[uint64]("[18446744073709551615,1]", 64)
	if err != nil || !slices.Equal(counts, []uint64{18446744073709551615, 1}) {
		t.Errorf("counts = %v, %v", counts, err)
	}
	if empty, err := parseArray[int16]("[]", 16); err != nil || len(empty) != 0 {
		t.Errorf("[] = %v, %v", empty, err)
	}
	for _, bad := range []string{"", "[", "1,2", "[1,,2]", "[1,2,]", "[40000]", "[1.5]", "[-1]x"} {
		if _, err := parseArray[int16](bad, 16); err == nil {
			t.Errorf("%q parsed as Int16 keys", bad)
		}
	}
	if _, err := parseArray[uint64]("[-1]", 64); err == nil {
		t.Error("[-1] parsed as UInt64 counts")
	}
}

func TestParseArrayBounds(t *testing.T) {
	for text, want := range map[string][]int16{"[-32768,32767]": {-32768, 32767}, "[-0,7]": {0, 7}} {
		got, err := parseArray[int16](text, 16)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s = %v, %v; want %v", text, got, err, want)
		}
	}
	for _, bad := range []string{"[32768]", "[-32769]", "[--1]", "[1-]", "[ 1]", "[-]"} {
		if _, err := parseArray[int16](bad, 16); err == nil {
			t.Errorf("%q parsed as Int16 keys", bad)
		}
	}
	if _, err := parseArray[uint64]("[18446744073709551616]", 64); err == nil {
		t.Error("2^64 parsed as a UInt64 count")
	}
}
