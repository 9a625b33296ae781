/*
 * gen: deterministic inputs for the policy lab's recordings.
 *
 *   gen lines N SEED   N lines of random words and numbers (for sort)
 *   gen csv N SEED     a header and N CSV rows id,name,city,amount,day (sqlite3)
 *   gen text BYTES SEED  about BYTES of word text with repeated passages (zstd)
 *
 * The generator is splitmix64, so the output depends only on the arguments,
 * not on the C library or the machine.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t state;

static uint64_t next(void)
{
	uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static uint64_t below(uint64_t n) { return next() % n; }

static const char *syll[] = {
	"ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "zi", "pa", "qu", "xe",
	"bo", "di", "fu", "ga", "hi", "jo", "ly", "wa", "an", "el", "or", "ut",
};
#define NSYLL (sizeof syll / sizeof syll[0])

/* A vocabulary of 4096 words of 1-4 syllables, made from the seed. */
static char vocab[4096][12];

static void make_vocab(void)
{
	for (int i = 0; i < 4096; i++) {
		int n = 1 + (int)below(4);
		vocab[i][0] = 0;
		for (int j = 0; j < n; j++)
			strcat(vocab[i], syll[below(NSYLL)]);
	}
}

/* Zipf-like word choice: small indices are common. */
static const char *word(void)
{
	uint64_t r = below(4096);
	return vocab[(r * r) / 4096];
}

static const char *cities[] = {
	"Aberdeen", "Bergen", "Cork", "Dresden", "Erfurt", "Faro", "Gdansk",
	"Haarlem", "Izmir", "Jena", "Kassel", "Lyon", "Malmo", "Nantes",
	"Oulu", "Porto", "Quimper", "Riga", "Split", "Turku", "Utrecht",
	"Vigo", "Wroclaw", "Xanten", "York", "Zadar",
};

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: gen lines|csv|text N SEED\n");
		return 2;
	}
	unsigned long long n = strtoull(argv[2], 0, 10);
	state = strtoull(argv[3], 0, 10);
	make_vocab();
	static char buf[1 << 16];
	setvbuf(stdout, buf, _IOFBF, sizeof buf);

	if (strcmp(argv[1], "lines") == 0) {
		for (unsigned long long i = 0; i < n; i++) {
			int w = 2 + (int)below(5);
			for (int j = 0; j < w; j++)
				printf("%s ", word());
			printf("%llu\n", (unsigned long long)below(1000000000));
		}
	} else if (strcmp(argv[1], "csv") == 0) {
		printf("id,name,city,amount,day\n");
		for (unsigned long long i = 0; i < n; i++)
			printf("%llu,%s %s,%s,%llu.%02llu,2024-%02llu-%02llu\n", i + 1,
			       word(), word(),
			       cities[below(sizeof cities / sizeof cities[0])],
			       (unsigned long long)below(100000),
			       (unsigned long long)below(100),
			       (unsigned long long)(1 + below(12)),
			       (unsigned long long)(1 + below(28)));
	} else if (strcmp(argv[1], "text") == 0) {
		/* Paragraphs of words; a third of them repeat an earlier
		 * paragraph (kept in a ring of 256), so that matches lie up to
		 * megabytes back. */
		static char ring[256][2048];
		static size_t ringlen[256];
		unsigned long long out = 0;
		int made = 0;
		while (out < n) {
			char *p;
			size_t len;
			if (made > 16 && below(3) == 0) {
				int k = (int)below(made < 256 ? made : 256);
				p = ring[k];
				len = ringlen[k];
			} else {
				int k = made % 256;
				p = ring[k];
				len = 0;
				int w = 40 + (int)below(200);
				for (int j = 0; j < w && len < 2000; j++)
					len += (size_t)sprintf(p + len, "%s%s", j ? " " : "", word());
				p[len++] = '\n';
				ringlen[k] = len;
				made++;
			}
			fwrite(p, 1, len, stdout);
			out += len;
		}
	} else {
		fprintf(stderr, "gen: unknown mode %s\n", argv[1]);
		return 2;
	}
	return 0;
}
