/* standalone: replays fuzz inputs without a fuzzer.
 *
 *     fuzz_<target> FILE|DIR...
 *
 * Calls LLVMFuzzerTestOneInput once per file named, and once per regular
 * file in each directory named (not recursive, names starting with '.'
 * skipped), in sorted order so a failure names the same file on every run.  Each input is copied into a
 * buffer of exactly its size, as libFuzzer does, so a sanitizer catches a
 * read one byte past it.  Exit status 0 when every input ran; a broken
 * invariant aborts, naming the input on stderr first.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	long size;
	int err = -1;

	if (!f) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		return -1;
	}
	if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 ||
	    fseek(f, 0, SEEK_SET) != 0) {
		fprintf(stderr, "%s: cannot size\n", path);
		goto out;
	}
	/* malloc(0) may return NULL; a 0-byte input is still an input. */
	buf = malloc(size ? (size_t)size : 1);
	if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
		fprintf(stderr, "%s: cannot read\n", path);
		goto out;
	}
	fprintf(stderr, "running %s (%ld bytes)\n", path, size);
	LLVMFuzzerTestOneInput(buf, (size_t)size);
	err = 0;
out:
	free(buf);
	fclose(f);
	return err;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *dir, int *ran)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char **names = NULL;
	size_t n = 0, cap = 0;
	int err = 0;

	if (!d) {
		fprintf(stderr, "%s: %s\n", dir, strerror(errno));
		return -1;
	}
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		if (n == cap) {
			char **grown;

			cap = cap ? 2 * cap : 64;
			grown = realloc(names, cap * sizeof(*names));
			if (!grown) {
				err = -1;
				goto out;
			}
			names = grown;
		}
		if (!(names[n] = malloc(strlen(dir) + strlen(de->d_name) + 2))) {
			err = -1;
			goto out;
		}
		sprintf(names[n++], "%s/%s", dir, de->d_name);
	}
	qsort(names, n, sizeof(*names), cmp_names);
	for (size_t i = 0; i < n && !err; i++) {
		struct stat st;

		if (stat(names[i], &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		err = run_file(names[i]);
		(*ran)++;
	}
out:
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	closedir(d);
	return err;
}

int main(int argc, char **argv)
{
	int ran = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		struct stat st;
		int err;

		if (stat(argv[i], &st) != 0) {
			fprintf(stderr, "%s: %s\n", argv[i], strerror(errno));
			return 1;
		}
		if (S_ISDIR(st.st_mode)) {
			err = run_dir(argv[i], &ran);
		} else {
			err = run_file(argv[i]);
			ran++;
		}
		if (err)
			return 1;
	}
	printf("%d inputs ran\n", ran);
	return 0;
}
