/*
 * pause: the process that holds a pod sandbox's namespaces, like upstream
 * Kubernetes' build/pause/linux/pause.c. It sleeps until SIGTERM or SIGINT,
 * exits 0 on either, and reaps every child it inherits (as PID 1 of a pod's
 * PID namespace it adopts orphans). Built by hack/images.py with
 * `gcc -static -Os` into the registry.k8s.io/pause image.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "patchbay-pause 3.10"

static void sigdown(int signo) {
    psignal(signo, "Shutting down, got signal");
    exit(0);
}

static void sigreap(int signo) {
    (void)signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-v") == 0) {
            printf("%s\n", VERSION);
            return 0;
        }
    }
    if (getpid() != 1) {
        fprintf(stderr, "Warning: pause should be the first process\n");
    }
    struct sigaction down = {.sa_handler = sigdown};
    struct sigaction reap = {.sa_handler = sigreap, .sa_flags = SA_NOCLDSTOP};
    sigemptyset(&down.sa_mask);
    sigemptyset(&reap.sa_mask);
    if (sigaction(SIGINT, &down, NULL) < 0 || sigaction(SIGTERM, &down, NULL) < 0 ||
        sigaction(SIGCHLD, &reap, NULL) < 0) {
        perror("sigaction");
        return 1;
    }
    for (;;) {
        pause();
    }
}
