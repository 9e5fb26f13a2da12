/* The process tree under the supervisor, read from /proc. mpirun puts every rank in a process
 * group of its own, so stopping a job by its process group alone would leave the ranks running;
 * the supervisor signals each descendant instead (it is a child subreaper, so ranks orphaned by a
 * dead mpirun stay its descendants). */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ft_internal.h"

/* pid's state and parent from /proc/pid/stat: "pid (comm) S ppid ..."; comm may hold ')' */
static int read_stat(pid_t pid, char *state, pid_t *ppid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    int pp = 0;
    if (!p || sscanf(p + 1, " %c %d", state, &pp) != 2) return 0;
    *ppid = (pid_t)pp;
    return 1;
}

char ft_proc_state(pid_t pid) {
    char s = 0;
    pid_t pp;
    return read_stat(pid, &s, &pp) ? s : 0;
}

int ft_proc_descendants(pid_t root, pid_t *out, int cap) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0, cap_all = 1024;
    pid_t(*all)[2] = malloc((size_t)cap_all * sizeof *all);
    struct dirent *de;
    while (all && (de = readdir(d))) {
        if (!isdigit((unsigned char)de->d_name[0])) continue;
        pid_t pid = (pid_t)atoi(de->d_name), pp;
        char s;
        if (!read_stat(pid, &s, &pp)) continue;
        if (n == cap_all) {
            pid_t(*g)[2] = realloc(all, (size_t)(cap_all *= 2) * sizeof *all);
            if (!g) break;
            all = g;
        }
        all[n][0] = pid;
        all[n][1] = pp;
        n++;
    }
    closedir(d);
    /* breadth first from root */
    int k = 0;
    for (int i = 0; i < n && k < cap; i++)
        if (all[i][1] == root) out[k++] = all[i][0];
    for (int head = 0; head < k; head++)
        for (int i = 0; i < n && k < cap; i++)
            if (all[i][1] == out[head]) out[k++] = all[i][0];
    free(all);
    return k;
}
