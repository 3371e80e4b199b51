package childproc

import "syscall"

// sysProcAttr puts the child in its own process group and has the kernel
// send it sig when the thread that started it exits (see Start).
func sysProcAttr(sig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: sig}
}
