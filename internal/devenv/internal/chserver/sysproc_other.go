//go:build !linux

package chserver

import "syscall"

// sysProcAttr puts the server in its own process group, so that it and any
// helper it forks can be signalled together and a Ctrl-C in a terminal
// reaches only the parent. Without a parent-death signal, a server left by a
// killed parent is stopped by the next Start on the same directory.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
