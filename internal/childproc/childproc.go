// Package childproc runs a child process that does not outlive this one:
// the child leads its own process group (so that it and whatever it forks
// are signalled together, and a Ctrl-C in a terminal reaches only the
// parent), and on Linux the kernel sends it a signal when the parent dies,
// so that a SIGKILLed meterd or test binary leaves no server running. The
// test ClickHouse servers (internal/adapter/devenv) and the test cluster's ZooKeeper
// (internal/testkit/chcluster) are started through it.
package childproc

import (
	"io"
	"os/exec"
	"runtime"
	"syscall"
)

// Proc is a started child process.
type Proc struct {
	// Pid is the child's process id; it leads a process group of that id.
	Pid  int
	done chan struct{}
	err  error
}

// Start starts cmd in its own process group, with deathSignal sent to it
// when this process dies (Linux only), and reaps it when it exits, closing
// out then. It sets cmd.SysProcAttr.
//
// The goroutine that starts the child stays locked to its OS thread for the
// child's life, because Linux sends the parent-death signal when the thread
// that started the child exits, not the process; a locked thread exits only
// with its goroutine, after the child is gone.
func Start(cmd *exec.Cmd, out io.Closer, deathSignal syscall.Signal) (*Proc, error) {
	cmd.SysProcAttr = sysProcAttr(deathSignal)
	p := &Proc{done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer out.Close()
		if err := cmd.Start(); err != nil {
			close(p.done)
			started <- err
			return
		}
		p.Pid = cmd.Process.Pid
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// Done is closed once the child has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the child has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is the child's exit status; valid once Done is closed.
func (p *Proc) Err() error { return p.err }

// KillGroup sends SIGKILL to the child's process group and waits until the
// child has been reaped.
func (p *Proc) KillGroup() {
	if p.Exited() {
		return
	}
	_ = syscall.Kill(-p.Pid, syscall.SIGKILL) // ESRCH: gone already
	<-p.done
}
