/*
 * powerfs: a FUSE pass-through file system that can lose power (as etcd's LazyFS).
 *
 *   powerfs BACKING MOUNTPOINT [-f] [fuse options]
 *
 * Every operation goes straight to BACKING, so while the power is on the mount behaves as the
 * page cache does: what was written is read back at once. What was not made durable is
 * remembered so that it can be taken back:
 *
 *   - file data: a write or truncate of a file not fsynced since remembers the bytes it
 *     overwrote and the file's size at its last fsync (fsync and fdatasync make it durable);
 *   - directory entries: a create, mkdir, rename, unlink or rmdir is remembered (a replaced or
 *     unlinked file is kept as a hard link in BACKING/.powerfs-stash) until the directory
 *     holding it is fsynced (POSIX: an fsync of the file alone does not make its name durable).
 *
 * Writing "cut" to the control file MOUNTPOINT/.powerfs is the power cut: every remembered
 * change is undone, newest first (data first, then directory entries), so that BACKING holds
 * exactly what a disk holds after a power loss at that instant. Reading .powerfs gives the
 * counters: "cuts=N dropped_bytes=N dropped_files=N dropped_entries=N pending_files=N".
 * Stop every writer (kill -9 the process under test) before the cut: a real power loss stops
 * them too. Metadata (modes, times) is passed through and not taken back.
 *
 * Run single-threaded (-s is forced): operations are atomic with respect to a cut. The kernel
 * keeps no cached state across one: entry and attribute timeouts are 0, and file pages are
 * dropped at every open (no kernel_cache); writes are never cached in the kernel (no
 * writeback cache), so a write() has reached this process when it returns.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define CTL "/.powerfs"
#define STASH ".powerfs-stash"

static int root_fd = -1;      /* BACKING */
static unsigned long stash_seq;
static unsigned long cuts, dropped_bytes, dropped_files, dropped_entries;

/* Bytes a write or truncate overwrote or cut off, to put back at a cut. */
struct undo {
    off_t off;
    size_t len;
    char *old;
    struct undo *next; /* older */
};

/* A file written since its last fsync. */
struct dirty {
    char *path;          /* its current name (renames move it) */
    off_t durable_size;  /* its size at its last fsync */
    struct undo *undo;   /* newest first */
    struct dirty *next;
};

enum op_kind { OP_CREATE, OP_MKDIR, OP_RENAME, OP_UNLINK, OP_RMDIR };

/* A directory change not yet made durable by an fsync of its directory. */
struct op {
    enum op_kind kind;
    char *path;   /* created, removed, or renamed from */
    char *path2;  /* renamed to */
    char *stash;  /* the replaced or unlinked file, kept as a hard link; or NULL */
    mode_t mode;  /* of a removed directory */
    struct op *next; /* older */
};

static struct dirty *dirties;
static struct op *ops;

struct handle {
    int fd;
    int append;
};

static const char *rel(const char *path)
{
    return path[1] ? path + 1 : ".";
}

static int is_hidden(const char *path)
{
    return strcmp(path, "/" STASH) == 0 || strncmp(path, "/" STASH "/", sizeof(STASH) + 1) == 0;
}

static struct dirty **find_dirty(const char *path)
{
    struct dirty **d = &dirties;
    while (*d && strcmp((*d)->path, path) != 0)
        d = &(*d)->next;
    return d;
}

static void free_dirty(struct dirty *d)
{
    while (d->undo) {
        struct undo *u = d->undo;
        d->undo = u->next;
        free(u->old);
        free(u);
    }
    free(d->path);
    free(d);
}

/* Forget what `path` held unsynced: it is durable now (fsync) or gone. */
static void drop_dirty(const char *path)
{
    struct dirty **d = find_dirty(path);
    if (*d) {
        struct dirty *gone = *d;
        *d = gone->next;
        free_dirty(gone);
    }
}

/* The dirty record of `path`, made when the file gets its first unsynced change. */
static struct dirty *get_dirty(const char *path, int fd)
{
    struct dirty **found = find_dirty(path);
    if (*found)
        return *found;
    struct stat st;
    if (fstat(fd, &st) < 0)
        return NULL;
    struct dirty *d = calloc(1, sizeof *d);
    d->path = strdup(path);
    d->durable_size = st.st_size;
    d->next = dirties;
    dirties = d;
    return d;
}

static void rename_dirty(const char *from, const char *to)
{
    drop_dirty(to);
    struct dirty *d = *find_dirty(from);
    if (d) {
        free(d->path);
        d->path = strdup(to);
    }
}

/* Remember the bytes [off, off + len) of `fd` (those that exist) before they change. */
static int save_range(struct dirty *d, int fd, off_t off, size_t len)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    if (off >= st.st_size || len == 0)
        return 0;
    if ((off_t)len > st.st_size - off)
        len = st.st_size - off;
    struct undo *u = calloc(1, sizeof *u);
    u->old = malloc(len);
    ssize_t n = pread(fd, u->old, len, off);
    if (n < 0) {
        int e = errno;
        free(u->old);
        free(u);
        return -e;
    }
    u->off = off;
    u->len = n;
    u->next = d->undo;
    d->undo = u;
    return 0;
}

static void push_op(enum op_kind kind, const char *path, const char *path2, const char *stash,
                    mode_t mode)
{
    struct op *o = calloc(1, sizeof *o);
    o->kind = kind;
    o->path = strdup(path);
    o->path2 = path2 ? strdup(path2) : NULL;
    o->stash = stash ? strdup(stash) : NULL;
    o->mode = mode;
    o->next = ops;
    ops = o;
}

static void free_op(struct op *o)
{
    free(o->path);
    free(o->path2);
    free(o->stash);
    free(o);
}

/* Keep `path` (an existing file about to be replaced or unlinked) as a hard link in the stash;
 * returns the stash path (to free), or NULL when `path` is no file. */
static char *stash(const char *path)
{
    struct stat st;
    if (fstatat(root_fd, rel(path), &st, AT_SYMLINK_NOFOLLOW) < 0 || S_ISDIR(st.st_mode))
        return NULL;
    char *kept;
    if (asprintf(&kept, "/" STASH "/%lu", ++stash_seq) < 0)
        return NULL;
    if (linkat(root_fd, rel(path), root_fd, rel(kept), 0) < 0) {
        free(kept);
        return NULL;
    }
    rename_dirty(path, kept);
    return kept;
}

static void unstash(struct op *o)
{
    if (o->stash) {
        unlinkat(root_fd, rel(o->stash), 0);
        drop_dirty(o->stash);
    }
}

static char *parent(const char *path)
{
    char *copy = strdup(path);
    char *dir = strdup(dirname(copy));
    free(copy);
    return dir;
}

static int in_dir(const char *path, const char *dir)
{
    if (!path)
        return 0;
    char *p = parent(path);
    int same = strcmp(p, dir) == 0;
    free(p);
    return same;
}

/* fsync of a directory: its entries' changes are durable. */
static void commit_dir(const char *dir)
{
    struct op **o = &ops;
    while (*o) {
        if (in_dir((*o)->path, dir) || in_dir((*o)->path2, dir)) {
            struct op *done = *o;
            *o = done->next;
            unstash(done);
            free_op(done);
        } else {
            o = &(*o)->next;
        }
    }
}

static void undo_data(struct dirty *d)
{
    int fd = openat(root_fd, rel(d->path), O_WRONLY);
    if (fd < 0)
        return;
    for (struct undo *u = d->undo; u; u = u->next) {
        if (pwrite(fd, u->old, u->len, u->off) < 0)
            perror("powerfs: undo write");
    }
    struct stat st;
    if (fstat(fd, &st) == 0) {
        fprintf(stderr, "powerfs: cut: %s back to %lld bytes (was %lld)\n", d->path,
                (long long)d->durable_size, (long long)st.st_size);
        if (st.st_size > d->durable_size)
            dropped_bytes += st.st_size - d->durable_size;
    }
    if (ftruncate(fd, d->durable_size) < 0)
        perror("powerfs: undo truncate");
    close(fd);
}

static void undo_op(struct op *o)
{
    switch (o->kind) {
    case OP_CREATE:
        unlinkat(root_fd, rel(o->path), 0);
        break;
    case OP_MKDIR:
        unlinkat(root_fd, rel(o->path), AT_REMOVEDIR);
        break;
    case OP_RENAME:
        renameat(root_fd, rel(o->path2), root_fd, rel(o->path));
        if (o->stash)
            renameat(root_fd, rel(o->stash), root_fd, rel(o->path2));
        return; /* the stash is back in place */
    case OP_UNLINK:
        renameat(root_fd, rel(o->stash), root_fd, rel(o->path));
        return;
    case OP_RMDIR:
        mkdirat(root_fd, rel(o->path), o->mode);
        break;
    }
    unstash(o);
}

/* The power cut: every unsynced change is taken back, newest first. */
static void cut(void)
{
    while (dirties) {
        struct dirty *d = dirties;
        dirties = d->next;
        undo_data(d);
        dropped_files++;
        free_dirty(d);
    }
    while (ops) {
        struct op *o = ops;
        ops = o->next;
        undo_op(o);
        dropped_entries++;
        free_op(o);
    }
    cuts++;
    fprintf(stderr, "powerfs: power cut %lu: %lu bytes, %lu files, %lu entries dropped so far\n",
            cuts, dropped_bytes, dropped_files, dropped_entries);
}

static unsigned long pending_files(void)
{
    unsigned long n = 0;
    for (struct dirty *d = dirties; d; d = d->next)
        n++;
    return n;
}

/* ---- FUSE operations ---- */

static void *pf_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
    (void)conn;
    cfg->use_ino = 1;
    cfg->entry_timeout = 0;
    cfg->attr_timeout = 0;
    cfg->negative_timeout = 0;
    cfg->kernel_cache = 0;
    cfg->hard_remove = 1; /* no .fuse_hidden renames: unlinked open files are served by fd */
    cfg->nullpath_ok = 0;
    return NULL;
}

static int pf_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
    if (strcmp(path, CTL) == 0) {
        memset(st, 0, sizeof *st);
        st->st_mode = S_IFREG | 0600;
        st->st_nlink = 1;
        return 0;
    }
    if (is_hidden(path))
        return -ENOENT;
    int r = fi ? fstat(((struct handle *)fi->fh)->fd, st)
               : fstatat(root_fd, rel(path), st, AT_SYMLINK_NOFOLLOW);
    return r < 0 ? -errno : 0;
}

static int pf_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
    (void)off;
    (void)fi;
    (void)flags;
    int fd = openat(root_fd, rel(path), O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return -errno;
    DIR *dir = fdopendir(fd);
    if (!dir) {
        close(fd);
        return -errno;
    }
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (strcmp(path, "/") == 0 && strcmp(e->d_name, STASH) == 0)
            continue;
        if (fill(buf, e->d_name, NULL, 0, 0))
            break;
    }
    closedir(dir);
    return 0;
}

/* Open (or create) `path`: always read-write underneath, so that overwritten bytes can be
 * saved; O_APPEND and O_TRUNC are done here, so that they are remembered too. */
static int open_file(const char *path, int flags, mode_t mode, struct fuse_file_info *fi)
{
    if (is_hidden(path))
        return -ENOENT;
    int exists = faccessat(root_fd, rel(path), F_OK, AT_SYMLINK_NOFOLLOW) == 0;
    int under = (flags & ~(O_ACCMODE | O_APPEND | O_TRUNC)) | O_RDWR;
    int fd = openat(root_fd, rel(path), under, mode);
    if (fd < 0 && errno == EACCES)
        fd = openat(root_fd, rel(path), (under & ~O_ACCMODE) | (flags & O_ACCMODE), mode);
    if (fd < 0)
        return -errno;
    if (!exists) {
        push_op(OP_CREATE, path, NULL, NULL, 0);
        get_dirty(path, fd); /* its data is not durable either: size 0 */
    }
    if ((flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY) {
        struct dirty *d = get_dirty(path, fd);
        int r = d ? save_range(d, fd, 0, (size_t)-1 >> 1) : -EIO;
        if (r < 0 || ftruncate(fd, 0) < 0) {
            close(fd);
            return r < 0 ? r : -errno;
        }
    }
    struct handle *h = calloc(1, sizeof *h);
    h->fd = fd;
    h->append = (flags & O_APPEND) != 0;
    fi->fh = (uint64_t)(uintptr_t)h;
    return 0;
}

static int pf_open(const char *path, struct fuse_file_info *fi)
{
    if (strcmp(path, CTL) == 0) {
        fi->direct_io = 1;
        fi->fh = 0;
        return 0;
    }
    return open_file(path, fi->flags, 0, fi);
}

static int pf_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
    return open_file(path, fi->flags | O_CREAT, mode, fi);
}

static int pf_read(const char *path, char *buf, size_t size, off_t off,
                   struct fuse_file_info *fi)
{
    if (strcmp(path, CTL) == 0) {
        char text[256];
        int n = snprintf(text, sizeof text,
                         "cuts=%lu dropped_bytes=%lu dropped_files=%lu dropped_entries=%lu "
                         "pending_files=%lu\n",
                         cuts, dropped_bytes, dropped_files, dropped_entries, pending_files());
        if (off >= n)
            return 0;
        if ((size_t)(n - off) < size)
            size = n - off;
        memcpy(buf, text + off, size);
        return size;
    }
    ssize_t n = pread(((struct handle *)fi->fh)->fd, buf, size, off);
    return n < 0 ? -errno : (int)n;
}

static int pf_write(const char *path, const char *buf, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    if (strcmp(path, CTL) == 0) {
        if (size >= 3 && memcmp(buf, "cut", 3) == 0) {
            cut();
            return size;
        }
        return -EINVAL;
    }
    struct handle *h = fi->fh ? (struct handle *)fi->fh : NULL;
    if (!h)
        return -EBADF;
    struct stat st;
    if (fstat(h->fd, &st) < 0)
        return -errno;
    if (h->append)
        off = st.st_size;
    struct dirty *d = get_dirty(path, h->fd);
    if (!d)
        return -EIO;
    int r = save_range(d, h->fd, off, size);
    if (r < 0)
        return r;
    ssize_t n = pwrite(h->fd, buf, size, off);
    return n < 0 ? -errno : (int)n;
}

static int pf_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
    if (strcmp(path, CTL) == 0)
        return 0;
    int fd = fi ? ((struct handle *)fi->fh)->fd : openat(root_fd, rel(path), O_RDWR);
    if (fd < 0)
        return -errno;
    struct dirty *d = get_dirty(path, fd);
    int r = d ? save_range(d, fd, size, (size_t)-1 >> 1) : -EIO;
    if (r == 0 && ftruncate(fd, size) < 0)
        r = -errno;
    if (!fi)
        close(fd);
    return r;
}

static int pf_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
    (void)datasync;
    (void)fi;
    drop_dirty(path); /* what it holds is on "disk" now */
    return 0;
}

static int pf_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi)
{
    (void)datasync;
    (void)fi;
    commit_dir(path);
    return 0;
}

static int pf_release(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    struct handle *h = (struct handle *)fi->fh;
    if (h) {
        close(h->fd);
        free(h);
    }
    return 0;
}

static int pf_mkdir(const char *path, mode_t mode)
{
    if (mkdirat(root_fd, rel(path), mode) < 0)
        return -errno;
    push_op(OP_MKDIR, path, NULL, NULL, 0);
    return 0;
}

static int pf_rmdir(const char *path)
{
    struct stat st;
    if (fstatat(root_fd, rel(path), &st, 0) < 0)
        return -errno;
    if (unlinkat(root_fd, rel(path), AT_REMOVEDIR) < 0)
        return -errno;
    push_op(OP_RMDIR, path, NULL, NULL, st.st_mode & 07777);
    return 0;
}

/* The operation that stash() prepared for failed: the stashed copy goes, its pending undo
 * record moves back to path. */
static void drop_stash(char *kept, const char *path)
{
    if (!kept)
        return;
    rename_dirty(kept, path);
    unlinkat(root_fd, rel(kept), 0);
    free(kept);
}

static int pf_unlink(const char *path)
{
    if (is_hidden(path) || strcmp(path, CTL) == 0)
        return -EPERM;
    char *kept = stash(path);
    if (unlinkat(root_fd, rel(path), 0) < 0) {
        int e = errno;
        drop_stash(kept, path);
        return -e;
    }
    if (kept)
        push_op(OP_UNLINK, path, NULL, kept, 0);
    else
        drop_dirty(path);
    free(kept);
    return 0;
}

static int pf_rename(const char *from, const char *to, unsigned int flags)
{
    if (flags & ~RENAME_NOREPLACE)
        return -EINVAL;
    if (is_hidden(from) || is_hidden(to))
        return -EPERM;
    if ((flags & RENAME_NOREPLACE) && faccessat(root_fd, rel(to), F_OK, AT_SYMLINK_NOFOLLOW) == 0)
        return -EEXIST;
    char *kept = stash(to);
    if (renameat(root_fd, rel(from), root_fd, rel(to)) < 0) {
        int e = errno;
        drop_stash(kept, to);
        return -e;
    }
    rename_dirty(from, to);
    push_op(OP_RENAME, from, to, kept, 0);
    free(kept);
    return 0;
}

static int pf_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
    if (strcmp(path, CTL) == 0)
        return 0;
    int r = fi ? fchmod(((struct handle *)fi->fh)->fd, mode) : fchmodat(root_fd, rel(path), mode, 0);
    return r < 0 ? -errno : 0;
}

static int pf_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
    (void)fi;
    return fchownat(root_fd, rel(path), uid, gid, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

static int pf_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
    if (strcmp(path, CTL) == 0)
        return 0;
    int r = fi ? futimens(((struct handle *)fi->fh)->fd, tv)
               : utimensat(root_fd, rel(path), tv, AT_SYMLINK_NOFOLLOW);
    return r < 0 ? -errno : 0;
}

static int pf_statfs(const char *path, struct statvfs *st)
{
    (void)path;
    return fstatvfs(root_fd, st) < 0 ? -errno : 0;
}

static int pf_access(const char *path, int mask)
{
    if (strcmp(path, CTL) == 0)
        return 0;
    return faccessat(root_fd, rel(path), mask, 0) < 0 ? -errno : 0;
}

static int pf_flush(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    (void)fi;
    return 0;
}

static const struct fuse_operations ops_table = {
    .init = pf_init,
    .getattr = pf_getattr,
    .readdir = pf_readdir,
    .open = pf_open,
    .create = pf_create,
    .read = pf_read,
    .write = pf_write,
    .truncate = pf_truncate,
    .fsync = pf_fsync,
    .fsyncdir = pf_fsyncdir,
    .release = pf_release,
    .flush = pf_flush,
    .mkdir = pf_mkdir,
    .rmdir = pf_rmdir,
    .unlink = pf_unlink,
    .rename = pf_rename,
    .chmod = pf_chmod,
    .chown = pf_chown,
    .utimens = pf_utimens,
    .statfs = pf_statfs,
    .access = pf_access,
};

static void clear_stash(void)
{
    int fd = openat(root_fd, STASH, O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
        mkdirat(root_fd, STASH, 0700);
        return;
    }
    DIR *dir = fdopendir(fd);
    struct dirent *e;
    while (dir && (e = readdir(dir)))
        if (e->d_name[0] != '.')
            unlinkat(fd, e->d_name, 0);
    if (dir)
        closedir(dir);
}

int main(int argc, char *argv[])
{
    if (argc < 3) {
        fprintf(stderr, "usage: powerfs BACKING MOUNTPOINT [-f] [fuse options]\n");
        return 2;
    }
    root_fd = open(argv[1], O_RDONLY | O_DIRECTORY);
    if (root_fd < 0) {
        fprintf(stderr, "powerfs: cannot open the backing directory %s: %s\n", argv[1],
                strerror(errno));
        return 2;
    }
    clear_stash();
    /* fuse_main sees: powerfs MOUNTPOINT -s [rest] */
    char **args = calloc(argc + 2, sizeof *args);
    int n = 0;
    args[n++] = argv[0];
    args[n++] = argv[2];
    args[n++] = "-s";
    for (int i = 3; i < argc; i++)
        args[n++] = argv[i];
    umask(0);
    return fuse_main(n, args, &ops_table, NULL);
}
