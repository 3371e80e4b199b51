package gpu

import (
	"strconv"
	"strings"
)

// migSlices is the number of compute slices ("g" in a MIG profile name) of a
// whole card, by gpu_type prefix:
//
//	A100, H100, H200, GH200, B200: 7   (1g.10gb ... 7g.80gb on an H100)
//	A30:                           4   (1g.6gb, 2g.12gb, 4g.24gb)
//
// Unknown MIG-capable models fall back to 7, the count of every
// data-centre part since Ampere except the A30.
func migSlices(gpuType string) int {
	if strings.HasPrefix(gpuType, "A30") {
		return 4
	}
	return 7
}

// MIGFraction is the share of the card a MIG GPU instance holds: its compute
// slices over the card's (1g.10gb on an H100 is 1/7). slices is the slice
// count DCGM reports for the instance, or 0 to read it from the profile name
// ("3g.40gb" -> 3, "1g.10gb+me" -> 1). It returns 0 when neither gives a
// count, which the contract reads as the whole GPU.
func MIGFraction(gpuType, profile string, slices int) float64 {
	if slices <= 0 {
		slices = profileSlices(profile)
	}
	if slices <= 0 {
		return 0
	}
	total := migSlices(gpuType)
	if slices >= total {
		return 1
	}
	return float64(slices) / float64(total)
}

// profileSlices reads N of a MIG GPU instance profile "Ng.<mem>gb[+ext]".
func profileSlices(profile string) int {
	n, _, ok := strings.Cut(profile, "g.")
	if !ok {
		return 0
	}
	v, err := strconv.Atoi(n)
	if err != nil || v <= 0 {
		return 0
	}
	return v
}
