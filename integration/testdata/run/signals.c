/* signals: signal handlers write into managed memory while the main
 * thread works through other managed memory: a SIGALRM timer's handler
 * marks pages of one half of a buffer while the main thread rewrites the
 * other half, and a SIGUSR1 handler counts in a managed buffer of its
 * own. Under a small host budget the pages a handler touches may be on
 * the device, so the handler itself faults. */
#include "run.h"

#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#define SIZE (16u << 20)
#define HALF (SIZE / 2)
#define PAGE 4096u
#define ALARMS 60

static unsigned char *buf;
static volatile long *usr_counter;
static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	if (alarms >= ALARMS)
		return;
	/* Pages far apart, so that most are in blocks the main thread's
	 * work pushed off the host. */
	size_t k = (size_t)alarms;
	buf[HALF + (k * 37 % (HALF / PAGE)) * PAGE + 123] = (unsigned char)(k + 1);
	alarms = alarms + 1;
}

static void on_usr1(int sig)
{
	(void)sig;
	usr_counter[0]++;
	usr_counter[(4u << 20) / sizeof(long) - 1] += 2; /* the last page too */
}

int main(void)
{
	buf = malloc(SIZE);
	usr_counter = malloc(4u << 20);
	CHECK(buf != NULL && usr_counter != NULL);
	if (!buf || !usr_counter)
		return run_done("signals");
	MANAGED(buf);
	MANAGED((void *)usr_counter);
	memset(buf + HALF, 0, HALF);

	struct sigaction sa = {0};
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = on_alarm;
	CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
	sa.sa_handler = on_usr1;
	CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
	struct itimerval it = {.it_interval = {0, 2000}, .it_value = {0, 2000}};
	CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);

	size_t bad = 0;
	int sweeps = 0, usr1 = 0;
	for (; (alarms < ALARMS || usr1 < 10) && sweeps < 5000; sweeps++) {
		fill(buf, HALF, (unsigned)sweeps);
		bad += verify(buf, HALF, (unsigned)sweeps);
		if (usr1 < 10) {
			CHECK(kill(getpid(), SIGUSR1) == 0);
			usr1++;
		}
	}
	struct itimerval off = {0};
	setitimer(ITIMER_REAL, &off, NULL);
	CHECK(bad == 0);
	CHECK(alarms == ALARMS);
	CHECK(usr1 == 10);
	CHECK(usr_counter[0] == 10);
	CHECK(usr_counter[(4u << 20) / sizeof(long) - 1] == 20);
	size_t marks = 0;
	for (size_t k = 0; k < (size_t)alarms; k++)
		marks += buf[HALF + (k * 37 % (HALF / PAGE)) * PAGE + 123] == (unsigned char)(k + 1);
	CHECK(marks == (size_t)alarms);
	printf("signals: %d alarms, %d SIGUSR1, %d sweeps\n", (int)alarms, usr1, sweeps);
	free(buf);
	free((void *)usr_counter);
	return run_done("signals");
}
