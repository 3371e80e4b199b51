package chserver

import "syscall"

// sysProcAttr puts the server in its own process group, so that it and any
// helper it forks can be signalled together and a Ctrl-C in a terminal
// reaches only the parent, and asks the kernel to send it SIGTERM when the
// parent dies, so that a SIGKILLed meterd or test binary does not leave the
// server running. See process.run for the thread this signal is tied to.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
