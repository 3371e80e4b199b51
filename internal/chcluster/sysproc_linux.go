package chcluster

import "syscall"

// sysProcAttr puts ZooKeeper in its own process group, so that the JVM and
// anything it forks are killed together, and has the kernel kill it when
// the thread that started it exits (see startProcess): a killed test binary
// leaves no ZooKeeper behind. The ClickHouse servers get the same from
// chserver.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
