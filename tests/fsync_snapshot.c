/* Test-only LD_PRELOAD shim: a faithful image of "what survives a power loss".
 *
 * Every successful fsync/fdatasync of a regular file directly inside the folder
 * named by SPHERECAL_FSYNC_WATCH copies that file, as it is at that instant, to
 * SPHERECAL_FSYNC_SNAPSHOT/<name> (temporary file, then rename: never half a copy)
 * and appends "<op> <name> <size>" to SPHERECAL_FSYNC_SNAPSHOT/fsync.log. Written
 * bytes that were never synced are exactly what an OS crash may lose, so the copies
 * are the worst case the disk may hold after one: SQLite's database and WAL as of
 * their last sync (tests/power_loss.py restores them).
 *
 * SPHERECAL_FSYNC_DELAY_US (optional) makes every sync that many microseconds
 * slower: a slow disk for bench/store_durability.py, on any disk.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void slow_disk(void) {
    const char *delay = getenv("SPHERECAL_FSYNC_DELAY_US");
    if (delay != NULL) usleep((useconds_t)strtoul(delay, NULL, 10));
}

static void copy_synced(int fd, const char *op) {
    const char *watch = getenv("SPHERECAL_FSYNC_WATCH");
    const char *out = getenv("SPHERECAL_FSYNC_SNAPSHOT");
    if (watch == NULL || out == NULL) return;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = '\0';
    size_t w = strlen(watch);
    if (strncmp(path, watch, w) != 0 || path[w] != '/') return;
    const char *name = path + w + 1;
    if (*name == '\0' || strchr(name, '/') != NULL) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;

    pthread_mutex_lock(&lock);
    char tmp[4096], final[4096], logpath[4096];
    snprintf(tmp, sizeof tmp, "%s/.%s.%d.tmp", out, name, (int)getpid());
    snprintf(final, sizeof final, "%s/%s", out, name);
    snprintf(logpath, sizeof logpath, "%s/fsync.log", out);
    int dst = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    off_t size = 0;
    if (dst >= 0) {
        char buf[1 << 16];
        ssize_t got;
        while ((got = pread(fd, buf, sizeof buf, size)) > 0) {
            if (write(dst, buf, (size_t)got) != got) break;
            size += got;
        }
        close(dst);
        rename(tmp, final);
    }
    int log = open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (log >= 0) {
        char line[4200];
        int len = snprintf(line, sizeof line, "%s %s %lld\n", op, name, (long long)size);
        if (write(log, line, (size_t)len) != len) { /* best effort */ }
        close(log);
    }
    pthread_mutex_unlock(&lock);
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    slow_disk();
    int rc = real(fd);
    int saved = errno;
    if (rc == 0) copy_synced(fd, "fsync");
    errno = saved;
    return rc;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    slow_disk();
    int rc = real(fd);
    int saved = errno;
    if (rc == 0) copy_synced(fd, "fdatasync");
    errno = saved;
    return rc;
}
