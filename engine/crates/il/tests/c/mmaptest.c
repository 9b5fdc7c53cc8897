/* mmap mixed with write(2)/pwrite(2)/ftruncate(2)/fallocate(2), as
 * databases (SQLite's -shm), HDF5 and numpy do. Run in a directory of a
 * Peregrine mount with and without libperegrine_il.so, and in a local
 * directory (ext4, tmpfs): the output must be the same.
 *
 *   mmaptest write-then-map DIR   data written with write()/pwrite() (and a
 *                                 size set by ftruncate) is in a mapping
 *                                 made afterwards, up to the new end of file
 *   mmap-then-write DIR           a MAP_SHARED mapping sees later pwrite()s,
 *                                 through its descriptor and through one
 *                                 opened later, ftruncate and fallocate;
 *                                 read() sees stores into the mapping
 *
 * Each step uses a file of its own (a file stays on the kernel path in a
 * process once mapped there). Prints "<file> <length> <fnv-1a hex>" for
 * every file (the test reads them from another process and compares) and
 * "OK", or "FAIL ..." and exits 1. A
 * mapping faulting beyond the kernel's idea of the end of file kills the
 * program with SIGBUS (exit status 135 from a shell).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define KIB 1024

static const char *step = "start";

static void fail(const char *what) {
    printf("FAIL %s: %s (errno %d %s)\n", step, what, errno, strerror(errno));
    exit(1);
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail(#cond);                                                                           \
    } while (0)

/* The model of the file: what ext4 would hold. */
static unsigned char model[1 << 20];
static size_t model_len;

static void put(size_t off, const void *p, size_t n) {
    if (off > model_len)
        memset(model + model_len, 0, off - model_len);
    memcpy(model + off, p, n);
    if (off + n > model_len)
        model_len = off + n;
}

static void resize(size_t n) {
    if (n > model_len)
        memset(model + model_len, 0, n - model_len);
    else
        memset(model + n, 0, model_len - n);
    model_len = n;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)x;
    }
}

static uint64_t fnv(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static off_t fsize(int fd) {
    struct stat st;
    CHECK(fstat(fd, &st) == 0);
    return st.st_size;
}

/* The mapping [0, len) equals the model (zeros past its end). */
static void mapping_is_model(const unsigned char *m, size_t len) {
    for (size_t i = 0; i < len; i++) {
        unsigned char want = i < model_len ? model[i] : 0;
        if (m[i] != want) {
            printf("FAIL %s: mapping byte %zu is %u, want %u\n", step, i, m[i], want);
            exit(1);
        }
    }
}

/* The whole file, read with read() through a new descriptor, equals the
 * model. */
static void file_is_model(const char *path) {
    static unsigned char buf[sizeof model + 1];
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        CHECK(r >= 0);
        if (r == 0)
            break;
        n += (size_t)r;
    }
    CHECK(close(fd) == 0);
    if (n != model_len || memcmp(buf, model, n) != 0) {
        printf("FAIL %s: %s reads %zu bytes fnv %016llx, want %zu fnv %016llx\n", step, path, n,
               (unsigned long long)fnv(buf, n), model_len,
               (unsigned long long)fnv(model, model_len));
        exit(1);
    }
}

/* Check `path` against the model, print its line, start a new model and
 * name the next file `name`. */
static char path[4096];
static const char *dir;

static void next_file(const char *name) {
    if (path[0]) {
        file_is_model(path);
        printf("%s %zu %016llx\n", strrchr(path, '/') + 1, model_len,
               (unsigned long long)fnv(model, model_len));
    }
    model_len = 0;
    path[0] = 0;
    if (name)
        snprintf(path, sizeof path, "%s/%s", dir, name);
}

static void write_then_map(void) {
    static unsigned char a[96 * KIB];

    next_file("wm1");
    step = "write, then map the new data";
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
    CHECK(fd >= 0);
    fill(a, 3 * 4096 + 100, 1);
    CHECK(write(fd, a, 3 * 4096 + 100) == 3 * 4096 + 100);
    put(0, a, 3 * 4096 + 100);
    unsigned char *m = mmap(NULL, 4 * 4096, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED);
    mapping_is_model(m, 4 * 4096); /* the tail of the last page reads zeros */
    CHECK(munmap(m, 4 * 4096) == 0);
    CHECK(close(fd) == 0);

    /* SQLite's -shm: extend with a one-byte write at the end of a 32 KiB
     * region, map the region, use it. */
    next_file("wm2");
    step = "extend by a one-byte pwrite, then map the region (SQLite -shm)";
    fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
    CHECK(fd >= 0);
    CHECK(pwrite(fd, "", 1, 64 * KIB - 1) == 1);
    put(64 * KIB - 1, "", 1);
    m = mmap(NULL, 64 * KIB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED);
    mapping_is_model(m, 64 * KIB);
    memcpy(m + 40 * KIB, "shm", 3);
    put(40 * KIB, "shm", 3);
    CHECK(munmap(m, 64 * KIB) == 0);
    CHECK(close(fd) == 0);

    next_file("wm3");
    step = "write, ftruncate up, then map";
    fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
    CHECK(fd >= 0);
    fill(a, 50000, 6);
    CHECK(write(fd, a, 50000) == 50000);
    put(0, a, 50000);
    CHECK(ftruncate(fd, 96 * KIB) == 0);
    resize(96 * KIB);
    m = mmap(NULL, 96 * KIB, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED);
    mapping_is_model(m, 96 * KIB);
    CHECK(munmap(m, 96 * KIB) == 0);
    CHECK(close(fd) == 0);

    /* Written through one descriptor (still open), mapped through another. */
    next_file("wm4");
    step = "write through one descriptor, map another (MAP_PRIVATE)";
    int w = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
    CHECK(w >= 0);
    fill(a, 92 * KIB, 7);
    CHECK(write(w, a, 92 * KIB) == 92 * KIB);
    put(0, a, 92 * KIB);
    int r = open(path, O_RDONLY);
    CHECK(r >= 0);
    CHECK(fsize(r) == 92 * KIB);
    fill(a, 8 * KIB, 2);
    CHECK(pwrite(w, a, 8 * KIB, 92 * KIB) == 8 * KIB);
    put(92 * KIB, a, 8 * KIB);
    m = mmap(NULL, 100 * KIB, PROT_READ, MAP_PRIVATE, r, 0);
    CHECK(m != MAP_FAILED);
    mapping_is_model(m, 100 * KIB);
    CHECK(munmap(m, 100 * KIB) == 0);
    /* A write through the descriptor still open after the mapping. */
    step = "pwrite through the other descriptor while mapped (MAP_SHARED)";
    m = mmap(NULL, 100 * KIB, PROT_READ, MAP_SHARED, r, 0);
    CHECK(m != MAP_FAILED);
    CHECK(pwrite(w, "late", 4, 50 * KIB) == 4);
    put(50 * KIB, "late", 4);
    mapping_is_model(m, 100 * KIB);
    CHECK(munmap(m, 100 * KIB) == 0);
    CHECK(close(r) == 0);
    CHECK(close(w) == 0);

    /* Closed after writing, reopened and mapped with no stat in between. */
    next_file("wm5");
    step = "write, close, reopen and map";
    w = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_APPEND, 0644);
    CHECK(w >= 0);
    fill(a, 5000, 3);
    CHECK(write(w, a, 5000) == 5000);
    put(0, a, 5000);
    CHECK(close(w) == 0);
    w = open(path, O_WRONLY | O_APPEND);
    CHECK(w >= 0);
    CHECK(write(w, a, 5000) == 5000);
    put(5000, a, 5000);
    CHECK(close(w) == 0);
    r = open(path, O_RDONLY);
    CHECK(r >= 0);
    m = mmap(NULL, 10000, PROT_READ, MAP_SHARED, r, 0);
    CHECK(m != MAP_FAILED);
    mapping_is_model(m, 10000);
    CHECK(munmap(m, 10000) == 0);
    CHECK(close(r) == 0);

    step = "read back";
    next_file(NULL);
}

static void map_then_write(void) {
    static unsigned char a[64 * KIB];
    next_file("mw");

    step = "ftruncate, map, store";
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
    CHECK(fd >= 0);
    CHECK(ftruncate(fd, 64 * KIB) == 0);
    resize(64 * KIB);
    unsigned char *m = mmap(NULL, 64 * KIB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED);
    mapping_is_model(m, 64 * KIB);
    fill(a, 4096, 4);
    memcpy(m, a, 4096);
    put(0, a, 4096);

    step = "pwrite through the mapped descriptor shows in the mapping";
    CHECK(pwrite(fd, "hello", 5, 100) == 5);
    put(100, "hello", 5);
    mapping_is_model(m, 64 * KIB);

    step = "read() sees stores into the mapping";
    unsigned char b[4096];
    CHECK(pread(fd, b, 4096, 0) == 4096);
    CHECK(memcmp(b, model, 4096) == 0);
    CHECK(lseek(fd, 0, SEEK_SET) == 0);
    CHECK(read(fd, b, 200) == 200);
    CHECK(memcmp(b, model, 200) == 0);

    step = "write() at the offset shows in the mapping";
    CHECK(write(fd, "world", 5) == 5);
    put(200, "world", 5);
    mapping_is_model(m, 64 * KIB);

    step = "a descriptor opened while mapped: pwrite shows in the mapping";
    int fd2 = open(path, O_RDWR);
    CHECK(fd2 >= 0);
    fill(a, 10000, 5);
    CHECK(pwrite(fd2, a, 10000, 30000) == 10000);
    put(30000, a, 10000);
    mapping_is_model(m, 64 * KIB);
    CHECK(fsize(fd2) == 64 * KIB);

    step = "ftruncate down and up again zeroes the mapping's tail";
    CHECK(ftruncate(fd2, 32 * KIB) == 0);
    resize(32 * KIB);
    CHECK(fsize(fd) == 32 * KIB);
    CHECK(ftruncate(fd2, 64 * KIB) == 0);
    resize(64 * KIB);
    mapping_is_model(m, 64 * KIB);

    step = "fallocate extends the file; a new mapping covers it";
    CHECK(fallocate(fd, 0, 0, 128 * KIB) == 0);
    resize(128 * KIB);
    CHECK(fsize(fd2) == 128 * KIB);
    unsigned char *m2 = mmap(NULL, 128 * KIB, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
    CHECK(m2 != MAP_FAILED);
    mapping_is_model(m2, 128 * KIB);
    CHECK(pwrite(fd2, "tail", 4, 100 * KIB) == 4);
    put(100 * KIB, "tail", 4);
    mapping_is_model(m2, 128 * KIB);
    memcpy(m2 + 120 * KIB, "m2", 2);
    put(120 * KIB, "m2", 2);
    mapping_is_model(m, 64 * KIB);

    step = "msync, munmap, close, read back";
    CHECK(msync(m, 64 * KIB, MS_SYNC) == 0);
    CHECK(msync(m2, 128 * KIB, MS_SYNC) == 0);
    CHECK(munmap(m, 64 * KIB) == 0);
    CHECK(munmap(m2, 128 * KIB) == 0);
    CHECK(close(fd2) == 0);
    CHECK(close(fd) == 0);
    file_is_model(path);

    /* After the last munmap: the file's descriptors behave as before. */
    step = "write after munmap";
    fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    CHECK(pwrite(fd, "after", 5, 128 * KIB) == 5);
    put(128 * KIB, "after", 5);
    CHECK(fsize(fd) == 128 * KIB + 5);
    CHECK(close(fd) == 0);
    next_file(NULL);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: mmaptest write-then-map|map-then-write DIR\n");
        return 2;
    }
    dir = argv[2];
    if (strcmp(argv[1], "write-then-map") == 0)
        write_then_map();
    else if (strcmp(argv[1], "map-then-write") == 0)
        map_then_write();
    else {
        fprintf(stderr, "mmaptest: unknown mode %s\n", argv[1]);
        return 2;
    }
    printf("OK\n");
    return 0;
}
