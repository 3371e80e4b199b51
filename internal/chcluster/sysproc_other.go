//go:build !linux

package chcluster

import "syscall"

// sysProcAttr puts ZooKeeper in its own process group, so that the JVM and
// anything it forks are killed together. Without a parent-death signal, a
// killed test binary leaves it running until it is killed by hand.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
