/* Pieces of the supervisor, one file each. */
#ifndef KILN_FT_INTERNAL_H
#define KILN_FT_INTERNAL_H

#include <sys/types.h>

/* The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, 'Z' zombie...), 0 when gone. */
char ft_proc_state(pid_t pid);
/* Every live descendant of root (children, their children...), at most cap; returns the count. */
int ft_proc_descendants(pid_t root, pid_t *out, int cap);

#endif
