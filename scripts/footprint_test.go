package scripts

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The limits of make run's footprint (issue 31): the data directory on
// disk and the dev ClickHouse's resident memory, at every moment, in the
// units of scripts/measure-demo.sh (MiB, GiB). The demo peaks at about
// 165-190 MiB on disk (half of it the 4 KiB blocks of small part files)
// and 400-520 MB resident.
const (
	maxDataBytes = 200 << 20
	maxCHRSS     = 1 << 30
)

// footprint samples, every second until stop, the disk blocks of a demo's
// data directory and the RSS of its dev ClickHouse (pid in
// clickhouse/clickhouse.pid), keeping the peaks: what
// scripts/measure-demo.sh measures, in the demo test.
type footprint struct {
	mu                sync.Mutex
	peakData, peakRSS int64
	atData, atRSS     time.Duration
	samples           int
	stop, done        chan struct{}
	once              sync.Once
}

func sampleFootprint(data string) *footprint {
	f := &footprint{stop: make(chan struct{}), done: make(chan struct{})}
	began := time.Now()
	go func() {
		defer close(f.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			d, r := diskBytes(data), chRSS(data)
			f.mu.Lock()
			f.samples++
			if d > f.peakData {
				f.peakData, f.atData = d, time.Since(began)
			}
			if r > f.peakRSS {
				f.peakRSS, f.atRSS = r, time.Since(began)
			}
			f.mu.Unlock()
			select {
			case <-f.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return f
}

// end stops the sampling (once; later calls wait for it too).
func (f *footprint) end() {
	f.once.Do(func() { close(f.stop) })
	<-f.done
}

// diskBytes is what the files under dir take on disk (their blocks, as du
// counts); files removed while it walks are skipped.
func diskBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// chRSS is the resident memory of the data directory's ClickHouse, 0 while
// it does not run.
func chRSS(data string) int64 {
	b, err := os.ReadFile(filepath.Join(data, "clickhouse", "clickhouse.pid"))
	if err != nil {
		return 0
	}
	status, err := os.ReadFile(filepath.Join("/proc", strings.TrimSpace(string(b)), "status"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
