/*
 * pause: the process that holds a pod's namespaces (the "sandbox" container).
 *
 * It does nothing but wait for signals: SIGINT/SIGTERM end it (the runtime stops the sandbox), and
 * SIGCHLD reaps zombies, since with a shared PID namespace it is PID 1 of the pod and inherits the
 * orphans of every container in it. Built static (gcc -static -O2) so the image needs no libc.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "3.10-peregrine"

static void on_term(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  int saved = errno;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  errno = saved;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    printf("pause %s\n", VERSION);
    return 0;
  }
  if (getpid() != 1) {
    /* Not an error: useful when testing by hand, as upstream's pause says too. */
    fprintf(stderr, "pause: not running as PID 1\n");
  }

  struct sigaction term = {.sa_handler = on_term};
  sigemptyset(&term.sa_mask);
  if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
  sigemptyset(&child.sa_mask);
  if (sigaction(SIGCHLD, &child, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }

  for (;;) {
    pause();
  }
}
