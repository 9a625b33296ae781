package workloads

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/softuvm/softuvm/libuvm"
)

// PeakWrapperName is the executable BuildPeakWrapper writes.
const PeakWrapperName = "uvm-peak-rss"

// peakWrapperSource is the wrapper through which a run measures the
// program's own peak RSS.
//
// A process's ru_maxrss is not only its own: at execve, Linux folds the
// peak of the address space being replaced into it, and a Go program
// starts its children with vfork, whose address space is the parent's.
// So a program exec'd from Go reports at least the Go process's peak:
// `true` run from a harness that had touched 100 MiB reported 105 MB.
// This wrapper is small (about 1 MiB resident); it forks (a child of its
// own, whose address space is a copy of this small one), execs the
// program there, waits for it, and writes the child's ru_maxrss in KiB
// to the file named by its first argument. It passes SIGTERM, SIGINT,
// SIGHUP and SIGQUIT on to the program, and ends as the program did: the
// same exit status, or killed by the same signal (without a core dump).
const peakWrapperSource = `#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile pid_t child;

static void pass_on(int sig) {
	if (child > 0)
		kill(child, sig);
}

int main(int argc, char **argv) {
	if (argc < 3) {
		fprintf(stderr, "usage: %s PEAK-FILE PROGRAM [ARGS...]\n", argv[0]);
		return 125;
	}
	static const int passed[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = pass_on;
	for (unsigned i = 0; i < sizeof passed / sizeof passed[0]; i++)
		sigaction(passed[i], &sa, NULL);
	pid_t pid = fork();
	if (pid < 0) {
		perror("uvm-peak-rss: fork");
		return 125;
	}
	if (pid == 0) {
		execvp(argv[2], argv + 2);
		int err = errno;
		fprintf(stderr, "uvm-peak-rss: cannot run %s: %s\n", argv[2], strerror(err));
		_exit(err == ENOENT ? 127 : 126);
	}
	child = pid;
	int status;
	struct rusage ru;
	while (wait4(pid, &status, 0, &ru) < 0) {
		if (errno != EINTR) {
			perror("uvm-peak-rss: wait4");
			return 125;
		}
	}
	FILE *f = fopen(argv[1], "w");
	if (f == NULL || fprintf(f, "%ld\n", ru.ru_maxrss) < 0 || fclose(f) != 0) {
		fprintf(stderr, "uvm-peak-rss: writing %s: %s\n", argv[1], strerror(errno));
		return 125;
	}
	if (WIFSIGNALED(status)) {
		int sig = WTERMSIG(status);
		struct rlimit none = {0, 0};
		setrlimit(RLIMIT_CORE, &none);
		signal(sig, SIG_DFL);
		sigset_t set;
		sigemptyset(&set);
		sigaddset(&set, sig);
		sigprocmask(SIG_UNBLOCK, &set, NULL);
		raise(sig);
		return 128 + sig;
	}
	return WEXITSTATUS(status);
}
`

// BuildPeakWrapper builds the wrapper that measures a program's own peak
// RSS (PeakWrapperName, from C source built into this package, with the
// C compiler libuvm.Compiler finds) into dir and returns its path. Set
// it as a Workload's PeakWrapper.
func BuildPeakWrapper(dir string) (string, error) {
	src, bin := filepath.Join(dir, PeakWrapperName+".c"), filepath.Join(dir, PeakWrapperName)
	if err := os.WriteFile(src, []byte(peakWrapperSource), 0o644); err != nil {
		return "", err
	}
	if err := libuvm.BuildProgram(bin, src); err != nil {
		return "", fmt.Errorf("a program's peak RSS is measured through a small C wrapper built at run time: %w", err)
	}
	return bin, nil
}

// readPeak reads the wrapper's file: the program's ru_maxrss in KiB.
func readPeak(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	kib, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || kib < 0 {
		return 0, fmt.Errorf("%s holds %q, want a number of KiB", path, b)
	}
	return kib << 10, nil
}
