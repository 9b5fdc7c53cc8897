/* Exercises the interception library: dup/dup2/F_DUPFD offset sharing,
 * pwrite/pread, readv/writev, lseek, O_APPEND, fork, threads, ftruncate,
 * fstat and stdio (fopen/fwrite/fread/fseek/ftell). Usage: iltest DIR */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c)                                                               \
	do {                                                                   \
		if (!(c)) {                                                    \
			fprintf(stderr, "FAIL %s:%d: %s (errno %d %s)\n",      \
				__FILE__, __LINE__, #c, errno,                 \
				strerror(errno));                              \
			exit(1);                                               \
		}                                                              \
	} while (0)

static char dir[4096];

static char *path(const char *name)
{
	static __thread char p[8192];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	return p;
}

#define TBLK (256 * 1024)
#define NTHR 4
#define NITER 8
static int tfd;

static void *worker(void *arg)
{
	long t = (long)arg;
	char *b = malloc(TBLK), *r = malloc(TBLK);
	for (int it = 0; it < NITER; it++) {
		off_t off = ((off_t)it * NTHR + t) * TBLK;
		for (int i = 0; i < TBLK; i++)
			b[i] = (char)(t * 31 + it * 7 + i);
		CHECK(pwrite(tfd, b, TBLK, off) == TBLK);
		CHECK(pread(tfd, r, TBLK, off) == TBLK);
		CHECK(memcmp(b, r, TBLK) == 0);
	}
	free(b);
	free(r);
	return NULL;
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	snprintf(dir, sizeof dir, "%s", argv[1]);
	char buf[8192], a[100], b[200], c[16];
	for (int i = 0; i < (int)sizeof buf; i++)
		buf[i] = (char)(i * 7 + 3);

	/* pwrite, fstat, lseek, write, readv */
	int fd = open(path("c1"), O_RDWR | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0);
	CHECK(pwrite(fd, buf, sizeof buf, 100) == (ssize_t)sizeof buf);
	struct stat st;
	CHECK(fstat(fd, &st) == 0 && st.st_size == 8292);
	CHECK(lseek(fd, 0, SEEK_END) == 8292);
	CHECK(write(fd, "tail", 4) == 4);
	CHECK(lseek(fd, 100, SEEK_SET) == 100);
	struct iovec iov[2] = { { a, sizeof a }, { b, sizeof b } };
	CHECK(readv(fd, iov, 2) == 300);
	CHECK(memcmp(a, buf, 100) == 0 && memcmp(b, buf + 100, 200) == 0);
	CHECK(lseek(fd, 0, SEEK_CUR) == 400);
	struct iovec wv[2] = { { "hello ", 6 }, { "world", 5 } };
	CHECK(pwritev(fd, wv, 2, 0) == 11);
	CHECK(pread(fd, c, 11, 0) == 11 && memcmp(c, "hello world", 11) == 0);

	/* dup / dup2 / F_DUPFD share the offset */
	int fd2 = dup(fd);
	CHECK(fd2 >= 0 && lseek(fd2, 0, SEEK_CUR) == 400);
	CHECK(read(fd, c, 10) == 10 && lseek(fd2, 0, SEEK_CUR) == 410);
	CHECK(dup2(fd, 50) == 50);
	CHECK(write(50, "XYZ", 3) == 3 && lseek(fd, 0, SEEK_CUR) == 413);
	CHECK(pread(fd2, c, 3, 410) == 3 && memcmp(c, "XYZ", 3) == 0);
	int fd3 = fcntl(fd, F_DUPFD_CLOEXEC, 60);
	CHECK(fd3 >= 60 && lseek(fd3, 0, SEEK_CUR) == 413);
	CHECK(close(fd) == 0 && close(50) == 0);
	CHECK(read(fd3, c, 2) == 2 && lseek(fd2, 0, SEEK_CUR) == 415);
	/* ftruncate, then EOF */
	CHECK(ftruncate(fd2, 10) == 0);
	CHECK(fstat(fd2, &st) == 0 && st.st_size == 10);
	CHECK(pread(fd2, c, 16, 0) == 10 && memcmp(c, "hello worl", 10) == 0);
	CHECK(pread(fd2, c, 16, 10) == 0);
	CHECK(fsync(fd2) == 0 && fdatasync(fd3) == 0);
	close(fd2);
	close(fd3);

	/* O_APPEND */
	int fa = open(path("app"), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
	CHECK(fa >= 0);
	CHECK(write(fa, "abc", 3) == 3);
	CHECK(lseek(fa, 0, SEEK_SET) == 0);
	CHECK(write(fa, "def", 3) == 3);
	CHECK(close(fa) == 0);
	fa = open(path("app"), O_RDONLY);
	CHECK(fa >= 0 && read(fa, c, 16) == 6 && memcmp(c, "abcdef", 6) == 0);
	CHECK(write(fa, "x", 1) == -1 && errno == EBADF);
	close(fa);

	/* fork: the child writes at the shared offset, reconnecting */
	int ff = open(path("forked"), O_RDWR | O_CREAT | O_TRUNC, 0644);
	CHECK(ff >= 0 && write(ff, "parent1\n", 8) == 8);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		if (write(ff, "child\n", 6) != 6)
			_exit(2);
		char r[8];
		if (pread(ff, r, 8, 0) != 8 || memcmp(r, "parent1\n", 8))
			_exit(3);
		exit(0);
	}
	int ws;
	CHECK(waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
	CHECK(write(ff, "parent2\n", 8) == 8);
	char fb[64];
	CHECK(pread(ff, fb, sizeof fb, 0) == 22);
	CHECK(memcmp(fb, "parent1\nchild\nparent2\n", 22) == 0);
	close(ff);

	/* threads on one fd */
	tfd = open(path("threads"), O_RDWR | O_CREAT | O_TRUNC, 0644);
	CHECK(tfd >= 0);
	pthread_t th[NTHR];
	for (long t = 0; t < NTHR; t++)
		CHECK(pthread_create(&th[t], NULL, worker, (void *)t) == 0);
	for (int t = 0; t < NTHR; t++)
		pthread_join(th[t], NULL);
	CHECK(fstat(tfd, &st) == 0 && st.st_size == (off_t)NTHR * NITER * TBLK);
	close(tfd);

	/* stdio */
	size_t n = 100000;
	char *w = malloc(n), *r = malloc(n);
	for (size_t i = 0; i < n; i++)
		w[i] = (char)(i * 13 + 1);
	FILE *f = fopen(path("stdio"), "w+");
	CHECK(f != NULL);
	CHECK(fwrite(w, 1, n, f) == n);
	CHECK(ftell(f) == (long)n);
	CHECK(fseek(f, 0, SEEK_SET) == 0);
	CHECK(fread(r, 1, n, f) == n && memcmp(w, r, n) == 0);
	CHECK(fread(r, 1, 10, f) == 0 && feof(f));
	CHECK(fseek(f, -10, SEEK_END) == 0 && ftell(f) == (long)n - 10);
	CHECK(fread(r, 1, 10, f) == 10 && memcmp(r, w + n - 10, 10) == 0);
	CHECK(fclose(f) == 0);
	f = fopen(path("stdio"), "a");
	CHECK(f != NULL && fwrite("END", 1, 3, f) == 3 && fclose(f) == 0);
	f = fopen(path("stdio"), "r");
	CHECK(f != NULL);
	memset(r, 0, n);
	CHECK(fread(r, 1, n, f) == n && memcmp(w, r, n) == 0);
	CHECK(fread(r, 1, 10, f) == 3 && memcmp(r, "END", 3) == 0);
	/* an unintercepted stdio call after intercepted ones stays in step */
	CHECK(fseek(f, 5, SEEK_SET) == 0 && fgetc(f) == (unsigned char)w[5]);
	CHECK(ftell(f) == 6);
	CHECK(fclose(f) == 0);
	CHECK(stat(path("stdio"), &st) == 0 && st.st_size == (off_t)n + 3);
	printf("OK\n");
	return 0;
}
