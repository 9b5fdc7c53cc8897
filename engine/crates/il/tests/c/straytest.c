/* Writes that go around the interception library's interposers: glibc's
 * stdio writes a stream's buffer with its own internal write, as does
 * dprintf. Usage: straytest DIR; makes DIR/c1..c4 (il.rs checks them). */
#include <stdio.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
int main(int argc, char **argv) {
    char p[4096];
    /* close(1), a stat the library serves (its first call: it connects
     * to the engines), then open: the file lands on 1, not the library's
     * connections; printf reaches it. */
    snprintf(p, sizeof p, "%s/c1", argv[1]);
    int saved = dup(1);
    close(1);
    struct stat st;
    if (stat(argv[1], &st) != 0) return 9;
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd != 1) {
        dprintf(saved, "open after close(1) gave %d\n", fd);
        return 10;
    }
    printf("line one\n");
    fflush(stdout);
    dup2(saved, 1);
    /* dprintf to a file the library made, mixed with write(). */
    snprintf(p, sizeof p, "%s/c2", argv[1]);
    fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (write(fd, "AAAA", 4) != 4) return 11;
    dprintf(fd, "%s", "BBBB");
    if (write(fd, "CCCC", 4) != 4) return 12;
    close(fd);
    /* fdopen and a buffered stream left for exit to flush. */
    snprintf(p, sizeof p, "%s/c3", argv[1]);
    fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
    FILE *f = fdopen(fd, "w");
    if (!f) return 13;
    fprintf(f, "stream %d\n", 42);
    /* dprintf to a placeholder never closed: exit moves it. */
    snprintf(p, sizeof p, "%s/c4", argv[1]);
    fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
    dprintf(fd, "left open\n");
    return 0;
}
