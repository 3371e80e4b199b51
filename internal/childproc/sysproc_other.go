//go:build !linux

package childproc

import "syscall"

// sysProcAttr puts the child in its own process group. Without a
// parent-death signal, a killed parent leaves it running until it is
// stopped by hand.
func sysProcAttr(syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
