/* Path calls for the interception library's metadata tests: prints what
 * each call returns, so that a run through the library can be compared
 * with a run on the kernel path. Usage: metatest CMD ARGS...
 *   stat PATH...    stat, lstat, fstatat, statx (all fields) and access
 *                   (F_OK, R_OK, W_OK, X_OK) of each PATH
 *   ns DIR          a fixed sequence of mkdir, rename, renameat2, unlink,
 *                   unlinkat and rmdir calls (with failures) in DIR, the
 *                   errno of each, then what is left (lstat by path)
 *   files DIR       opens that create, read-only opens (own offsets,
 *                   seeks, writes around the library), dup, fstat,
 *                   F_GETFL, O_APPEND, fork (a shared offset), exec (an
 *                   inherited descriptor), mmap and a lock on files made
 *                   in DIR; prints what each returns and the files' contents
 *   dirs DIR...     readdir of each DIR: its entries (name, inode, type)
 *                   sorted by name, the entry after a seekdir back to the
 *                   middle, the count after rewinddir and with readdir_r
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void pstat(const char *what, int r, const struct stat *s)
{
	if (r != 0) {
		printf("  %s: errno %d\n", what, errno);
		return;
	}
	printf("  %s: dev %lx ino %lu mode %o nlink %lu uid %u gid %u rdev %lx size %ld "
	       "blksize %ld blocks %ld a %ld.%09ld m %ld.%09ld c %ld.%09ld\n",
	       what, (unsigned long)s->st_dev, (unsigned long)s->st_ino, s->st_mode,
	       (unsigned long)s->st_nlink, s->st_uid, s->st_gid, (unsigned long)s->st_rdev,
	       (long)s->st_size, (long)s->st_blksize, (long)s->st_blocks,
	       (long)s->st_atim.tv_sec, s->st_atim.tv_nsec, (long)s->st_mtim.tv_sec,
	       s->st_mtim.tv_nsec, (long)s->st_ctim.tv_sec, s->st_ctim.tv_nsec);
}

static void pstatx(const char *what, int r, const struct statx *s)
{
	if (r != 0) {
		printf("  %s: errno %d\n", what, errno);
		return;
	}
	printf("  %s: mask %x attr %llx/%llx dev %u:%u ino %llu mode %o nlink %u uid %u "
	       "gid %u rdev %u:%u size %llu blksize %u blocks %llu mnt %llu a %lld.%09u "
	       "m %lld.%09u c %lld.%09u\n",
	       what, s->stx_mask & ~STATX_BTIME, (unsigned long long)s->stx_attributes,
	       (unsigned long long)s->stx_attributes_mask, s->stx_dev_major,
	       s->stx_dev_minor, (unsigned long long)s->stx_ino, s->stx_mode, s->stx_nlink,
	       s->stx_uid, s->stx_gid, s->stx_rdev_major, s->stx_rdev_minor,
	       (unsigned long long)s->stx_size, s->stx_blksize,
	       (unsigned long long)s->stx_blocks, (unsigned long long)s->stx_mnt_id,
	       (long long)s->stx_atime.tv_sec, s->stx_atime.tv_nsec,
	       (long long)s->stx_mtime.tv_sec, s->stx_mtime.tv_nsec,
	       (long long)s->stx_ctime.tv_sec, s->stx_ctime.tv_nsec);
}

static void cmd_stat(int n, char **paths)
{
	for (int i = 0; i < n; i++) {
		const char *p = paths[i];
		struct stat s;
		struct statx x;
		printf("%s\n", p);
		memset(&s, 0, sizeof s);
		pstat("stat", stat(p, &s), &s);
		memset(&s, 0, sizeof s);
		pstat("lstat", lstat(p, &s), &s);
		memset(&s, 0, sizeof s);
		pstat("fstatat", fstatat(AT_FDCWD, p, &s, AT_SYMLINK_NOFOLLOW), &s);
		memset(&x, 0, sizeof x);
		pstatx("statx", statx(AT_FDCWD, p, 0, STATX_BASIC_STATS, &x), &x);
		memset(&x, 0, sizeof x);
		pstatx("statx-nofollow",
		       statx(AT_FDCWD, p, AT_SYMLINK_NOFOLLOW, STATX_ALL, &x), &x);
		int m[4] = {F_OK, R_OK, W_OK, X_OK};
		printf("  access");
		for (int k = 0; k < 4; k++) {
			int r = access(p, m[k]);
			printf(" %d", r == 0 ? 0 : errno);
		}
		int r = faccessat(AT_FDCWD, p, R_OK | W_OK, AT_EACCESS);
		printf(" eaccess %d\n", r == 0 ? 0 : errno);
	}
}

static void step(const char *what, int r)
{
	printf("%s: %d\n", what, r == 0 ? 0 : errno);
}

static int mkfile(const char *p, const char *data)
{
	int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	if (fd < 0)
		return -1;
	int r = write(fd, data, strlen(data)) == (ssize_t)strlen(data) ? 0 : -1;
	return close(fd) || r;
}

static void cmd_ns(const char *dir)
{
	if (chdir(dir) != 0) {
		perror(dir);
		exit(1);
	}
	step("mkdir a", mkdir("a", 0755));
	step("mkdir a again", mkdir("a", 0755));
	step("mkdir a/b/c", mkdir("a/b/c", 0755));
	step("mkdir a/b", mkdir("a/b", 0750));
	step("mkdir x/", mkdir("x/", 0777));
	step("mkdir e", mkdir("e", 0777));
	step("mkfile a/f", mkfile("a/f", "data"));
	step("mkdir a/f/x", mkdir("a/f/x", 0755));
	step("rename a/f a/g", rename("a/f", "a/g"));
	step("rename a/nope a/h", rename("a/nope", "a/h"));
	step("rename a a/b/in", rename("a", "a/b/in"));
	step("renameat2 noreplace a/g x",
	     renameat2(AT_FDCWD, "a/g", AT_FDCWD, "x", RENAME_NOREPLACE));
	step("rename a/g x", rename("a/g", "x"));
	step("rename x a/g", rename("x", "a/g"));
	step("mkdir y", mkdir("y", 0755));
	step("mkfile y/z", mkfile("y/z", "zz"));
	step("rename x y", rename("x", "y"));
	step("rename x e", rename("x", "e"));
	step("renameat exchange a/g y",
	     renameat2(AT_FDCWD, "a/g", AT_FDCWD, "y", RENAME_EXCHANGE));
	step("renameat exchange a/g nope",
	     renameat2(AT_FDCWD, "a/g", AT_FDCWD, "nope", RENAME_EXCHANGE));
	step("rename a/g/z a/b/z2", renameat(AT_FDCWD, "a/g/z", AT_FDCWD, "a/b/z2"));
	step("rename y over a/b/z2", rename("y", "a/b/z2"));
	step("unlink a", unlink("a"));
	step("unlink a/nope", unlink("a/nope"));
	step("unlink a/b/z2/", unlink("a/b/z2/"));
	step("rmdir a", rmdir("a"));
	step("rmdir a/b/z2", rmdir("a/b/z2"));
	step("rmdir .", rmdir("."));
	step("unlinkat a/b/z2", unlinkat(AT_FDCWD, "a/b/z2", 0));
	step("unlinkat removedir a/g", unlinkat(AT_FDCWD, "a/g", AT_REMOVEDIR));
	step("unlinkat removedir a/g/", unlinkat(AT_FDCWD, "a/g/", AT_REMOVEDIR));
	step("rmdir e", rmdir("e"));
	umask(077);
	step("mkdir m (umask 077)", mkdir("m", 0777));
	umask(022);
	step("mkdir m/s", mkdir("m/s", 01777));
	step("mkdir ./m/../n", mkdir("./m/../n", 0755));
	const char *left[] = {"a", "a/b", "a/f", "a/g", "a/b/z2", "x", "y", "e", "m",
			      "m/s", "n", "nope"};
	for (unsigned i = 0; i < sizeof left / sizeof *left; i++) {
		struct stat s;
		if (lstat(left[i], &s) != 0)
			printf("%s: errno %d\n", left[i], errno);
		else
			printf("%s: mode %o nlink %lu size %ld\n", left[i], s.st_mode,
			       (unsigned long)s.st_nlink, (long)s.st_size);
	}
}

static void show(const char *p)
{
	char b[256];
	int fd = open(p, O_RDONLY);
	if (fd < 0) {
		printf("%s: open errno %d\n", p, errno);
		return;
	}
	ssize_t n = read(fd, b, sizeof b - 1);
	struct stat s;
	fstat(fd, &s);
	close(fd);
	b[n < 0 ? 0 : n] = 0;
	printf("%s: mode %o size %ld [%s]\n", p, s.st_mode, (long)s.st_size, b);
}

/* Read-only opens of "a" (holding "hello"): each open has its own offset
 * and its dups share it (the library keeps it: place.rs), through seeks,
 * a fork, posix_spawn and an exec; writes around the library fail as on a
 * read-only file; and the library's shared descriptor (700 or the first
 * free above) closed or replaced behind its back changes none of that. */
static void read_only_offsets(void)
{
	char b[64];
	int p = open("a", O_RDONLY), q = open("a", O_RDONLY);
	printf("read p: %zd [%.2s]\n", read(p, b, 2), b);
	printf("read q: %zd [%.3s]\n", read(q, b, 3), b);
	printf("read p: %zd [%.3s]\n", read(p, b, 3), b);
	printf("read p at end: %zd\n", read(p, b, 3));
	printf("tell q: %ld\n", (long)lseek(q, 0, SEEK_CUR));
	printf("SEEK_END-1 p: %ld\n", (long)lseek(p, -1, SEEK_END));
	printf("read p: %zd [%.1s]\n", read(p, b, 5), b);
	errno = 0;
	long r = lseek(p, -10, SEEK_CUR);
	printf("SEEK_CUR-10 p: %ld errno %d\n", r, errno);
	printf("SEEK_DATA 1 p: %ld\n", (long)lseek(p, 1, SEEK_DATA));
	int fl = fcntl(q, F_GETFL);
	printf("F_SETFL nonblock q: %d\n", fcntl(q, F_SETFL, fl | O_NONBLOCK));
	printf("read q: %zd [%.2s]\n", read(q, b, 5), b);
	errno = 0;
	r = syscall(SYS_write, p, "x", 1);
	printf("raw write p: %ld errno %d\n", r, errno);
	errno = 0;
	r = dprintf(p, "x");
	printf("dprintf p: %ld errno %d\n", r, errno);
	close(q);
	/* fork: the child reads on from the parent's offset, the parent on
	 * from the child's. */
	lseek(p, 1, SEEK_SET);
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		printf("child reads: %zd [%.2s]\n", read(p, b, 2), b);
		fflush(stdout);
		_exit(0);
	}
	waitpid(pid, NULL, 0);
	printf("parent reads: %zd [%.2s]\n", read(p, b, 2), b);
	close(p);
	/* exec and posix_spawn: the program inherits the offset. */
	p = open("a", O_RDONLY);
	read(p, b, 2);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		dup2(p, 0);
		char *argv[] = {"sh", "-c", "echo exec reads: $(cat)", NULL};
		execvp("sh", argv);
		_exit(127);
	}
	waitpid(pid, NULL, 0);
	close(p);
	p = open("a", O_RDONLY);
	read(p, b, 3);
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, p, 0);
	char *argv[] = {"sh", "-c", "echo spawn reads: $(cat)", NULL};
	extern char **environ;
	fflush(stdout);
	if (posix_spawnp(&pid, "sh", &fa, NULL, argv, environ) == 0)
		waitpid(pid, NULL, 0);
	posix_spawn_file_actions_destroy(&fa);
	close(p);
	/* The shared descriptor closed behind the library's back, then
	 * another file put on its number. */
	syscall(SYS_close_range, 700, 799, 0);
	p = open("a", O_RDONLY);
	printf("after close_range: %zd [%.5s]\n", read(p, b, 5), b);
	close(p);
	int w = open("a", O_RDWR);
	dup2(w, 700);
	close(w);
	p = open("a", O_RDONLY);
	errno = 0;
	r = syscall(SYS_write, p, "x", 1);
	printf("raw write after dup2: %ld errno %d\n", r, errno);
	printf("read after dup2: %zd [%.5s]\n", read(p, b, 5), b);
	close(p);
	close(700);
}

static void cmd_files(const char *dir)
{
	char b[64], *m;
	struct stat s;
	struct statx x;
	if (chdir(dir) != 0) {
		perror(dir);
		exit(1);
	}
	int fd = open("a", O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0666);
	printf("create a: %d\n", fd >= 0 ? 0 : errno);
	printf("write: %zd\n", write(fd, "hello", 5));
	int r = fstat(fd, &s);
	printf("fstat: %d size %ld mode %o\n", r, (long)s.st_size, s.st_mode);
	printf("F_GETFL acc %d append %d\n", fcntl(fd, F_GETFL) & O_ACCMODE,
	       !!(fcntl(fd, F_GETFL) & O_APPEND));
	printf("close: %d\n", close(fd));
	fd = open("a", O_CREAT | O_EXCL | O_WRONLY, 0666);
	printf("create a again: %d\n", fd >= 0 ? 0 : errno);
	fd = open("a", O_RDONLY);
	int d = dup(fd);
	printf("read: %zd\n", read(fd, b, 2));
	printf("read dup: %zd [%.3s]\n", read(d, b, 3), b);
	printf("lseek: %ld\n", (long)lseek(fd, 1, SEEK_SET));
	printf("pread: %zd [%.2s]\n", pread(d, b, 2, 3), b);
	r = statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &x);
	printf("statx empty: %d size %llu\n", r, (unsigned long long)x.stx_size);
	r = fstatat(fd, "", &s, AT_EMPTY_PATH);
	printf("fstatat empty: %d size %ld\n", r, (long)s.st_size);
	printf("F_GETFL acc %d\n", fcntl(fd, F_GETFL) & O_ACCMODE);
	ssize_t w = write(fd, "x", 1);
	printf("write on O_RDONLY: %zd errno %d\n", w, errno);
	close(fd);
	close(d);
	read_only_offsets();
	printf("open missing: %d\n", open("missing", O_RDONLY) >= 0 ? 0 : errno);
	printf("open a/x: %d\n", open("a/x", O_RDONLY) >= 0 ? 0 : errno);
	printf("open missing/x creat: %d\n",
	       open("missing/x", O_CREAT | O_WRONLY, 0666) >= 0 ? 0 : errno);
	fd = creat("b", 0666);
	printf("creat b: %d\n", fd >= 0 ? 0 : errno);
	close(fd);
	fd = open("c", O_CREAT | O_WRONLY | O_APPEND, 0640);
	write(fd, "12", 2);
	lseek(fd, 0, SEEK_SET);
	write(fd, "34", 2);
	printf("append offset: %ld\n", (long)lseek(fd, 0, SEEK_CUR));
	close(fd);
	/* An existing file written (the kernel path), read back. */
	fd = open("a", O_WRONLY);
	printf("write existing: %zd\n", pwrite(fd, "HE", 2, 0));
	close(fd);
	/* fork: parent and child share the offset. */
	fd = open("d", O_CREAT | O_WRONLY, 0644);
	write(fd, "parent1\n", 8);
	pid_t pid = fork();
	if (pid == 0) {
		write(fd, "child\n", 6);
		_exit(0);
	}
	waitpid(pid, NULL, 0);
	write(fd, "parent2\n", 8);
	close(fd);
	/* exec: the new program writes to an inherited descriptor. */
	fd = open("e", O_CREAT | O_WRONLY, 0644);
	write(fd, "before\n", 7);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		dup2(fd, 1);
		char *argv[] = {"sh", "-c", "echo from-exec", NULL};
		execvp("sh", argv);
		_exit(127);
	}
	waitpid(pid, NULL, 0);
	write(fd, "after\n", 6);
	close(fd);
	/* mmap of a file opened read-only. */
	fd = open("a", O_RDONLY);
	m = mmap(NULL, 5, PROT_READ, MAP_SHARED, fd, 0);
	printf("mmap a: %d [%.5s]\n", m != MAP_FAILED, m != MAP_FAILED ? m : "");
	if (m != MAP_FAILED)
		munmap(m, 5);
	close(fd);
	/* mmap of a file just made. */
	fd = open("f", O_CREAT | O_RDWR, 0644);
	write(fd, "mapped-bytes", 12);
	m = mmap(NULL, 12, PROT_READ, MAP_SHARED, fd, 0);
	printf("mmap: %d [%.12s]\n", m != MAP_FAILED, m != MAP_FAILED ? m : "");
	if (m != MAP_FAILED)
		munmap(m, 12);
	printf("flock: %d\n", flock(fd, LOCK_EX));
	struct flock l = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
	printf("F_SETLK: %d\n", fcntl(fd, F_SETLK, &l));
	write(fd, "+", 1);
	close(fd);
	/* Made, removed, made again by this process. */
	fd = open("g", O_CREAT | O_WRONLY, 0644);
	write(fd, "old", 3);
	close(fd);
	printf("unlink g: %d\n", unlink("g"));
	fd = open("g", O_CREAT | O_WRONLY | O_EXCL, 0644);
	write(fd, "new", 3);
	close(fd);
	printf("rename g h: %d\n", rename("g", "h"));
	/* Removed while open: still readable and writable through its fds. */
	int u = open("u", O_CREAT | O_WRONLY | O_EXCL, 0644);
	write(u, "kept", 4);
	int v = open("u", O_RDONLY);
	printf("unlink u while open: %d\n", unlink("u"));
	write(u, "+more", 5);
	memset(b, 0, sizeof b);
	printf("read unlinked: %zd [%s]\n", pread(v, b, sizeof b - 1, 0), b);
	close(u);
	close(v);
	printf("u after close: %d\n", access("u", F_OK) == 0 ? 0 : errno);
	const char *names[] = {"a", "b", "c", "d", "e", "f", "g", "h"};
	for (unsigned i = 0; i < sizeof names / sizeof *names; i++)
		show(names[i]);
}

struct ent {
	char name[256];
	unsigned long ino;
	unsigned char type;
};

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct ent *)a)->name, ((const struct ent *)b)->name);
}

static void cmd_dirs(int n, char **dirs)
{
	for (int i = 0; i < n; i++) {
		DIR *d = opendir(dirs[i]);
		printf("%s:\n", dirs[i]);
		if (!d) {
			printf("  opendir: errno %d\n", errno);
			continue;
		}
		size_t cap = 64, len = 0;
		struct ent *v = malloc(cap * sizeof(*v));
		long mid = -1;
		char after_mid[256] = "";
		struct dirent *e;
		errno = 0;
		while ((e = readdir(d)) != NULL) {
			if (len == cap)
				v = realloc(v, (cap *= 2) * sizeof(*v));
			snprintf(v[len].name, sizeof(v[len].name), "%s", e->d_name);
			v[len].ino = e->d_ino;
			v[len].type = e->d_type;
			len++;
			if (len == 150 || (mid < 0 && len == 3))
				mid = telldir(d);
			else if (len == 151 || (len == 4 && strcmp(after_mid, "") == 0))
				snprintf(after_mid, sizeof(after_mid), "%s", e->d_name);
		}
		printf("  end: errno %d, %zu entries\n", errno, len);
		/* The entry after the position told is the same once sought back. */
		seekdir(d, mid);
		e = readdir(d);
		printf("  after seekdir: %s\n", !e ? "(end)" : strcmp(e->d_name, after_mid) == 0 ? "same" : e->d_name);
		rewinddir(d);
		size_t again = 0;
		while (readdir(d))
			again++;
		printf("  after rewinddir: %zu\n", again);
		rewinddir(d);
		struct dirent buf, *out;
		size_t with_r = 0;
		while (readdir_r(d, &buf, &out) == 0 && out)
			with_r++;
		printf("  readdir_r: %zu\n", with_r);
		printf("  closedir: %d\n", closedir(d));
		qsort(v, len, sizeof(*v), by_name);
		for (size_t j = 0; j < len; j++)
			printf("  %s %lu %u\n", v[j].name, v[j].ino, v[j].type);
		free(v);
	}
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: metatest CMD ARGS...\n");
		return 2;
	}
	if (strcmp(argv[1], "stat") == 0) {
		cmd_stat(argc - 2, argv + 2);
		return 0;
	}
	if (strcmp(argv[1], "files") == 0 && argc == 3) {
		cmd_files(argv[2]);
		return 0;
	}
	if (strcmp(argv[1], "dirs") == 0) {
		cmd_dirs(argc - 2, argv + 2);
		return 0;
	}
	if (strcmp(argv[1], "ns") == 0 && argc == 3) {
		cmd_ns(argv[2]);
		return 0;
	}
	fprintf(stderr, "metatest: unknown command %s\n", argv[1]);
	return 2;
}
