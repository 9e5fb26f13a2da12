/* The JSON profile every benchmark writes: what machine and libraries it ran on, then its
 * measurements (sections "comm", "gemm", "membw" as arrays of flat records; see
 * docs/bench-profile.md). `kiln bench report` and `kiln size` read these. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "kiln/bench.h"
#include "kiln/fsutil.h"
#include "kiln/json.h"

static void cpu_model(char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(buf, n, "%s", c);
            }
            break;
        }
    fclose(f);
}

static double mem_gib(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (double)pages * (double)size / (1024.0 * 1024.0 * 1024.0) : 0;
}

cJSON *kiln_profile_new(const char *bench) {
    cJSON *p = cJSON_CreateObject();
    if (!p) return NULL;
    cJSON_AddNumberToObject(p, "kiln_profile", KILN_PROFILE_VERSION);
    cJSON_AddStringToObject(p, "bench", bench);
    char when[64];
    time_t t = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
    cJSON_AddStringToObject(p, "date", when);
    cJSON *m = cJSON_AddObjectToObject(p, "machine");
    char host[256] = "unknown", cpu[256];
    gethostname(host, sizeof host - 1);
    cpu_model(cpu, sizeof cpu);
    cJSON_AddStringToObject(m, "hostname", host);
    cJSON_AddStringToObject(m, "cpu", cpu);
    cJSON_AddNumberToObject(m, "cores", (double)sysconf(_SC_NPROCESSORS_ONLN));
    cJSON_AddNumberToObject(m, "memory_gib", mem_gib());
    cJSON *l = cJSON_AddObjectToObject(p, "libraries");
    cJSON_AddStringToObject(l, "openblas", openblas_get_config());
    cJSON_AddStringToObject(l, "cjson", cJSON_Version());
    return p;
}

cJSON *kiln_profile_section(cJSON *p, const char *section) {
    cJSON *a = cJSON_GetObjectItemCaseSensitive(p, section);
    return a ? a : cJSON_AddArrayToObject(p, section);
}

kiln_error *kiln_profile_write(const cJSON *p, const char *path) {
    char *text = kiln_json_print(p, 1);
    if (!text) return kiln_errorf(KILN_ENOMEM, "%s", path);
    kiln_error *e = kiln_write_file_atomic(path, text, strlen(text));
    free(text);
    return e;
}
