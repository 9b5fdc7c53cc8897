/* The mount table as a thread that is not the first to ask sees it: a
 * thread makes the process's first path calls into the mount and exits;
 * then, for each line on stdin, the main thread prints whether mnt/f and
 * mnt/tmpfs-only exist ("True False" as python prints it). Run from the
 * directory holding the mount, by meta.rs. */
#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>

static void *first_calls(void *arg) {
    struct stat st;
    for (int i = 0; i < 100; i++)
        stat("mnt/f", &st);
    return arg;
}

static const char *exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? "True" : "False";
}

int main(void) {
    pthread_t t;
    char line[64];
    if (pthread_create(&t, NULL, first_calls, NULL) != 0 || pthread_join(t, NULL) != 0)
        return 1;
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        const char *a = exists("mnt/f");
        printf("%s %s\n", a, exists("mnt/tmpfs-only"));
        fflush(stdout);
    }
    return 0;
}
