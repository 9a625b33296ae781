/* misuse: `misuse double-managed|interior|double-small` frees wrongly,
 * as buggy programs do. glibc aborts on a double free of small memory;
 * under `uvm run` a double free of managed memory, or a free of a
 * pointer inside it, aborts too, with a message naming the pointer. */
#include "run.h"

/* Called through a volatile pointer: the compiler neither warns about
 * nor optimizes away what it can prove is a double free. */
static void (*volatile release)(void *) = free;
static void *(*volatile allocate)(size_t) = malloc;

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: misuse double-managed|interior|double-small\n");
		return 2;
	}
	if (strcmp(argv[1], "double-managed") == 0) {
		unsigned char *p = allocate(8u << 20);
		p[0] = 1;
		release(p);
		release(p);
	} else if (strcmp(argv[1], "interior") == 0) {
		unsigned char *p = allocate(8u << 20);
		p[4096] = 1;
		release(p + 4096);
	} else if (strcmp(argv[1], "double-small") == 0) {
		unsigned char *p = allocate(64);
		p[0] = 1;
		release(p);
		release(p);
	} else {
		fprintf(stderr, "misuse: unknown case %s\n", argv[1]);
		return 2;
	}
	printf("misuse: %s survived\n", argv[1]);
	return 0;
}
