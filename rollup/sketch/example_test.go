package sketch_test

import (
	"fmt"

	"tokenmeter/rollup/sketch"
)

func ExampleHistogram() {
	// Two hourly histograms of TTFT (ms), as a rollup row stores them.
	var morning, evening sketch.Histogram
	for v := 1; v <= 1000; v++ {
		morning.Add(float64(v))
		evening.Add(float64(v) * 10)
	}
	var day sketch.Histogram
	day.Merge(morning)
	day.Merge(evening)

	ps, err := day.Quantiles(0.5, 0.9, 0.99)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d values in %d buckets; p50 %.4g ms, p90 %.4g ms, p99 %.4g ms\n", day.Count(), len(day.Keys), ps[0], ps[1], ps[2])
	// Output:
	// 2000 values in 315 buckets; p50 907 ms, p90 8024 ms, p99 9801 ms
}
