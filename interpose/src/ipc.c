/* CUDA IPC of served memory. Served memory is a VMM mapping, for which the driver has no IPC
 * handle, so cuIpcGetMemHandle of a served allocation exports the physical chunks beneath it as
 * file descriptors (wl_alloc_export) and answers a handle of ours: the exporting process, an
 * export id and two random keys. A process under libwavelet.so (any mode but off) recognises
 * such a handle in cuIpcOpenMemHandle, asks the exporter for the descriptors over a Unix socket
 * (SCM_RIGHTS; the exporter answers from a thread started at its first export, to processes of
 * its own user only), maps them with a VMM provider of its own and returns the allocation's
 * address; cuIpcCloseMemHandle unmaps at the last close. The exporter keeps no descriptors: it
 * exports the chunks again for each open (a few driver calls), so sharing thousands of tensors
 * does not run into the descriptor limit; a freed allocation's export is forgotten, and
 * importers must be done with it by then, as CUDA requires. Handles that are not ours (the
 * driver's) pass through both ways. */
#include "internal.h"
#include "ptrmap.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define IPC_MAGIC       "WLIPC\x01\xa5\x5a"
#define IPC_MAX_DEVICES 16
#define IPC_FDS_PER_MSG 64         /* SCM_RIGHTS takes at most 253 a message */
#define IPC_TIMEOUT_S   5          /* an exporter or importer that stops answering */
#define IPC_MAX_PIECES  (1u << 20) /* 20 TiB of 20 MiB chunks: anything more is not ours */

/* The handle, in CUipcMemHandle's 64 bytes. */
typedef struct ipc_handle_s {
  char magic[8];
  uint32_t pid;      /* the exporter */
  uint32_t id;       /* its export */
  uint64_t proc_key; /* names the exporter's socket: a pid may be reused */
  uint64_t key;      /* the export's, which the exporter checks: the handle is the capability */
  uint64_t ptr;      /* the exported allocation, in the exporter */
  uint64_t size;
  char unused[16];
} ipc_handle_t;
_Static_assert(sizeof(ipc_handle_t) == sizeof(CUipcMemHandle), "a handle fills CUipcMemHandle");

typedef struct ipc_req_s {
  uint64_t ptr;
  uint32_t id;
  uint32_t unused;
  uint64_t key;
} ipc_req_t;

typedef struct ipc_reply_s {
  int32_t status; /* 0 or a negative errno */
  uint32_t unused;
  uint64_t offset, size, piece, npieces; /* the export; its descriptors follow */
} ipc_reply_t;

/* ---- the exporter --------------------------------------------------------------------------*/

typedef struct ipc_export_s {
  uintptr_t ptr;
  uint32_t id;
  uint64_t key;
  wl_alloc_t *alloc;
  size_t size;
} ipc_export_t;

/* The exports, by pointer (a free looks its allocation up there, only while there are any). */
static pthread_mutex_t exp_lock = PTHREAD_MUTEX_INITIALIZER;
static wl__ptrmap_t exps;

static uint32_t next_id = 1;
static int srv_fd = -1;
static uint64_t proc_key;
/* Exports alive: the free path looks only while there are any. */
int wl__ipc_nexports;

static uint64_t random64(void) {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, 0) != sizeof v) /* no entropy source: still distinct per call */
    v = wl__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&v;
  return v;
}

static socklen_t sock_name(struct sockaddr_un *sa, uint32_t pid, uint64_t key) {
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  /* Abstract (leading NUL): nothing in the file system to leave behind. */
  int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "wavelet-ipc-%u-%016llx", pid,
                   (unsigned long long)key);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void set_timeouts(int fd) {
  struct timeval tv = {.tv_sec = IPC_TIMEOUT_S};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static ssize_t send_fds(int sock, const void *buf, size_t len, const int *fds, size_t n) {
  char ctl[CMSG_SPACE(IPC_FDS_PER_MSG * sizeof(int))];
  struct iovec iov = {(void *)buf, len};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (n) {
    memset(ctl, 0, sizeof ctl);
    m.msg_control = ctl;
    m.msg_controllen = CMSG_SPACE(n * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n * sizeof(int));
    memcpy(CMSG_DATA(c), fds, n * sizeof(int));
  }
  return sendmsg(sock, &m, MSG_NOSIGNAL);
}

/* Answers one importer: the export's layout, then its descriptors, exported now under exp_lock
 * (a free forgets the export under it first, so the allocation is live meanwhile) and sent
 * without it. */
static void serve_one(int c) {
  set_timeouts(c);
  ipc_reply_t rep = {.status = -EPERM};
  wl_alloc_export_t e = {0};
  struct ucred cr;
  socklen_t crl = sizeof cr;
  ipc_req_t req;
  if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &crl) != 0 ||
      (cr.uid != geteuid() && cr.uid != 0))
    goto reply;
  rep.status = -EPROTO;
  if (recv(c, &req, sizeof req, 0) != (ssize_t)sizeof req) goto reply;
  rep.status = -ENOENT; /* freed, or never exported */
  pthread_mutex_lock(&exp_lock);
  const ipc_export_t *x = exps.tab ? wl__ptrmap_get(&exps, (uintptr_t)req.ptr) : NULL;
  if (x && x->id == req.id && x->key == req.key) {
    rep.status = wl_alloc_export(x->alloc, (void *)x->ptr, &e);
    if (!rep.status) rep = (ipc_reply_t){0, 0, e.offset, e.size, e.piece, e.npieces};
  }
  pthread_mutex_unlock(&exp_lock);
reply:
  if (send_fds(c, &rep, sizeof rep, NULL, 0) == (ssize_t)sizeof rep && !rep.status)
    for (size_t k = 0; k < e.npieces; k += IPC_FDS_PER_MSG) {
      size_t n = WL_MIN((size_t)IPC_FDS_PER_MSG, e.npieces - k);
      char one = 0;
      if (send_fds(c, &one, 1, e.fds + k, n) != 1) break;
    }
  wl_alloc_export_close(&e);
}

static void *server_main(void *arg) {
  int fd = (int)(intptr_t)arg;
  for (;;) {
    int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        /* Out of descriptors or memory for now: the connection stays queued, so retrying at
         * once would spin; the importer's own timeout bounds its wait. */
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        continue;
      }
      wl__warn_once("CUDA IPC: the exporter's socket failed (%s): no more handles are opened",
                    strerror(errno));
      return NULL;
    }
    serve_one(c);
    close(c);
  }
}

/* Under exp_lock: the socket and its thread, once. */
static int server_start(void) {
  if (srv_fd >= 0) return 0;
  uint64_t key = random64();
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  struct sockaddr_un sa;
  socklen_t len = sock_name(&sa, (uint32_t)getpid(), key);
  pthread_attr_t at;
  pthread_t t;
  int rc = 0;
  if (bind(fd, (struct sockaddr *)&sa, len) != 0 || listen(fd, 64) != 0) {
    rc = -errno;
  } else {
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 64 << 10);
    rc = -wl__thread_create(&t, &at, server_main, (void *)(intptr_t)fd);
    pthread_attr_destroy(&at);
  }
  if (rc) {
    close(fd);
    return rc;
  }
  proc_key = key;
  srv_fd = fd;
  return 0;
}

int wl__ipc_export(wl_alloc_t *a, uintptr_t p, CUipcMemHandle *out) {
  /* A pointer into an allocation gets the allocation's handle, as from the driver (on an H200
   * too: the same handle, opened at the allocation's start). */
  if (!wl_alloc_usable_size(a, (void *)p)) {
    void *base = wl_alloc_base(a, (void *)p);
    if (base) p = (uintptr_t)base;
  }
  ipc_handle_t h = {.pid = (uint32_t)getpid(), .ptr = p};
  memcpy(h.magic, IPC_MAGIC, sizeof h.magic);
  pthread_mutex_lock(&exp_lock);
  int rc = server_start();
  if (!rc && !exps.tab) rc = wl__ptrmap_init(&exps, 64);
  ipc_export_t *x = rc ? NULL : wl__ptrmap_get(&exps, p); /* exported before: the same handle */
  if (!rc && !x) {
    /* Exported once now (then closed) so that a pointer that is not a live allocation, or
     * memory that cannot be shared, is answered here rather than at the open. */
    wl_alloc_export_t e;
    if ((rc = wl_alloc_export(a, (void *)p, &e)) == 0) {
      x = malloc(sizeof *x);
      if (x && wl__ptrmap_put(&exps, p, x) == 0) {
        *x = (ipc_export_t){p, next_id++, random64(), a, e.size};
        __atomic_store_n(&wl__ipc_nexports, (int)exps.count, __ATOMIC_RELAXED);
        wl__count(WL__ST_IPC_EXPORTS, 1);
      } else {
        free(x);
        x = NULL;
        rc = -ENOMEM;
      }
      wl_alloc_export_close(&e);
    }
  }
  if (x) {
    h.id = x->id;
    h.key = x->key;
    h.proc_key = proc_key;
    h.size = x->size;
  }
  pthread_mutex_unlock(&exp_lock);
  if (!rc) memcpy(out, &h, sizeof h);
  return rc;
}

void wl__ipc_forget(uintptr_t p) {
  pthread_mutex_lock(&exp_lock);
  if (exps.tab) {
    free(wl__ptrmap_del(&exps, p));
    __atomic_store_n(&wl__ipc_nexports, (int)exps.count, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&exp_lock);
}

/* ---- the importer --------------------------------------------------------------------------*/

typedef struct ipc_import_s {
  uint32_t pid, id;
  uint64_t key;
  uintptr_t ptr; /* what the program got */
  void *token;   /* the provider's */
  int dev;
  CUcontext ctx; /* current at the open: its cuCtxDestroy closes it */
  uint32_t refs;
} ipc_import_t;

static pthread_mutex_t imp_lock = PTHREAD_MUTEX_INITIALIZER;
static ipc_import_t *imps;
static size_t nimps, cap_imps;
/* A VMM provider per device for imports, made at the first (any mode but off: no allocator). */
static wl_provider_t iprov[IPC_MAX_DEVICES];
static int8_t iprov_state[IPC_MAX_DEVICES]; /* 0 not tried, 1 ready, -1 failed */

/* Under imp_lock: the provider for the calling thread's current device, or NULL (*dev -1: no
 * context). It runs its calls in the device's primary context, made current for its creation
 * if need be: a context the program created could be destroyed under it. */
static wl_provider_t *import_provider(int *dev, CUcontext *ctx) {
  int d = *dev = wl__current_device(ctx);
  if (d < 0 || d >= IPC_MAX_DEVICES) return NULL;
  if (!iprov_state[d]) {
    CUcontext prev = NULL;
    bool other = !wl__is_primary(*ctx, d);
    int rc = other ? wl__primary_enter(d, &prev) : 0;
    if (!rc) rc = wl_provider_vmm_init_with(&iprov[d], (int)d, wl__serve_resolve, NULL);
    if (other) wl__primary_leave(d, prev);
    iprov_state[d] = rc ? -1 : 1;
    if (rc)
      wl__warn_once("CUDA IPC: no VMM provider for device %d (%s): handles of served memory "
                    "cannot be opened",
                    (int)d, strerror(-rc));
  }
  return iprov_state[d] > 0 ? &iprov[d] : NULL;
}

static int recv_fds(int sock, void *buf, size_t len, int *fds, size_t max, size_t *got) {
  char ctl[CMSG_SPACE(IPC_FDS_PER_MSG * sizeof(int))];
  struct iovec iov = {buf, len};
  struct msghdr m = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  ssize_t r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
  if (r != (ssize_t)len) return r < 0 ? -errno : -EPROTO;
  *got = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t k = 0; k < n; k++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof fd);
      if (*got < max)
        fds[(*got)++] = fd;
      else
        close(fd); /* more than asked for: not kept */
    }
  }
  return (m.msg_flags & MSG_CTRUNC) ? -EPROTO : 0;
}

/* Asks the exporter of h for its descriptors: 0 with *rep and *fdsp (rep->npieces of them). */
static int fetch(const ipc_handle_t *h, ipc_reply_t *rep, int **fdsp) {
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) return -errno;
  set_timeouts(s);
  struct sockaddr_un sa;
  socklen_t len = sock_name(&sa, h->pid, h->proc_key);
  ipc_req_t req = {.ptr = h->ptr, .id = h->id, .key = h->key};
  int *fds = NULL;
  size_t have = 0;
  int rc = 0;
  if (connect(s, (struct sockaddr *)&sa, len) != 0) {
    rc = errno == ECONNREFUSED || errno == ENOENT ? -ESRCH : -errno; /* exporter gone */
    goto out;
  }
  size_t none;
  if (send(s, &req, sizeof req, MSG_NOSIGNAL) != (ssize_t)sizeof req ||
      (rc = recv_fds(s, rep, sizeof *rep, NULL, 0, &none)) != 0) {
    rc = rc ? rc : -EPROTO;
    goto out;
  }
  if ((rc = rep->status) != 0) goto out;
  if (!rep->npieces || rep->npieces > IPC_MAX_PIECES || !rep->piece || rep->offset >= rep->piece ||
      rep->size > rep->npieces * rep->piece - rep->offset) {
    rc = -EPROTO;
    goto out;
  }
  if (!(fds = malloc(rep->npieces * sizeof *fds))) {
    rc = -ENOMEM;
    goto out;
  }
  while (have < rep->npieces) {
    char one;
    size_t got = 0;
    if ((rc = recv_fds(s, &one, 1, fds + have, rep->npieces - have, &got)) != 0 || !got) {
      rc = rc ? rc : -EPROTO;
      have += got;
      goto out;
    }
    have += got;
  }
out:
  close(s);
  if (rc) {
    for (size_t k = 0; k < have; k++) close(fds[k]);
    free(fds);
    fds = NULL;
  }
  *fdsp = fds;
  return rc;
}

static CUresult errno_to_cu(int rc) {
  switch (rc) {
  case -ENOMEM:
    return CUDA_ERROR_OUT_OF_MEMORY;
  case -ESRCH:
  case -ENOENT:
    return CUDA_ERROR_INVALID_HANDLE;
  case -EPERM:
    return CUDA_ERROR_NOT_PERMITTED;
  case -EINVAL:
    return CUDA_ERROR_INVALID_VALUE;
  default:
    return CUDA_ERROR_MAP_FAILED;
  }
}

int wl__ipc_open(CUdeviceptr *pdptr, const CUipcMemHandle *handle, unsigned flags, CUresult *res) {
  ipc_handle_t h;
  memcpy(&h, handle, sizeof h);
  if (memcmp(h.magic, IPC_MAGIC, sizeof h.magic) != 0) return 0; /* the driver's */
  if (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) {
    *res = CUDA_ERROR_INVALID_VALUE;
    return 1;
  }
  /* The driver refuses a handle of the opening process. Ours only if this process made it: its
   * socket's key (a pid alone may be another namespace's process). */
  pthread_mutex_lock(&exp_lock);
  bool own = srv_fd >= 0 && h.proc_key == proc_key && h.pid == (uint32_t)getpid();
  pthread_mutex_unlock(&exp_lock);
  if (own) {
    *res = CUDA_ERROR_INVALID_CONTEXT;
    return 1;
  }
  pthread_mutex_lock(&imp_lock);
  int dev;
  CUcontext ctx = NULL;
  wl_provider_t *prov = import_provider(&dev, &ctx);
  *res = prov ? CUDA_SUCCESS : dev < 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_SUPPORTED;
  ipc_import_t *x = NULL;
  for (size_t i = 0; prov && i < nimps && !x; i++)
    if (imps[i].pid == h.pid && imps[i].id == h.id && imps[i].key == h.key && imps[i].dev == dev &&
        imps[i].ctx == ctx)
      x = &imps[i];
  if (x) { /* opened before here: counted, the same address (as the driver does) */
    x->refs++;
    *pdptr = (CUdeviceptr)x->ptr;
  } else if (prov) {
    ipc_reply_t rep;
    int *fds = NULL;
    uintptr_t base = 0;
    void *token = NULL;
    int rc = 0;
    if (nimps == cap_imps) { /* room first: nothing to undo after the import */
      size_t cap = cap_imps ? 2 * cap_imps : 16;
      ipc_import_t *n = realloc(imps, cap * sizeof *n);
      if (n) {
        imps = n;
        cap_imps = cap;
      } else {
        rc = -ENOMEM;
      }
    }
    if (!rc && (rc = fetch(&h, &rep, &fds)) == 0) {
      rc = prov->import(prov->ctx, fds, rep.npieces, rep.piece, &base, &token);
      for (size_t k = 0; k < rep.npieces; k++) close(fds[k]);
      free(fds);
    }
    if (rc) {
      *res = errno_to_cu(rc);
      wl__debug("CUDA IPC: cannot open the handle of pid %u, export %u: %s", h.pid, h.id,
                strerror(-rc));
    } else {
      imps[nimps++] =
          (ipc_import_t){h.pid, h.id, h.key, base + (uintptr_t)rep.offset, token, dev, ctx, 1};
      *pdptr = (CUdeviceptr)(base + rep.offset);
      wl__count(WL__ST_IPC_OPENS, 1);
    }
  }
  pthread_mutex_unlock(&imp_lock);
  return 1;
}

int wl__ipc_close(uintptr_t p, CUresult *res) {
  int found = 0;
  pthread_mutex_lock(&imp_lock);
  for (size_t i = 0; i < nimps && !found; i++) {
    if (imps[i].ptr != p) continue;
    found = 1;
    *res = CUDA_SUCCESS;
    if (--imps[i].refs) break;
    int rc = iprov[imps[i].dev].unimport(iprov[imps[i].dev].ctx, imps[i].token);
    if (rc) *res = errno_to_cu(rc);
    imps[i] = imps[--nimps];
  }
  pthread_mutex_unlock(&imp_lock);
  return found;
}

/* ---- device reset, context destruction
 * ---------------------------------------------------------*/

/* What this process opened in the context (ctx), or on the device when NULL: the program's
 * addresses die with them, as the driver's own opens do; a later close of one is the driver's
 * to refuse. */
static void close_on(int device, CUcontext ctx) {
  pthread_mutex_lock(&imp_lock);
  for (size_t i = 0; i < nimps;) {
    if (ctx ? imps[i].ctx != ctx : imps[i].dev != device) {
      i++;
      continue;
    }
    iprov[imps[i].dev].unimport(iprov[imps[i].dev].ctx, imps[i].token);
    imps[i] = imps[--nimps];
  }
  pthread_mutex_unlock(&imp_lock);
}

void wl__ipc_reset(int device, CUcontext primary) {
  close_on(device, primary);
}

void wl__ipc_ctx_destroy(CUcontext ctx) {
  close_on(-1, ctx);
}

/* The child has neither the parent's thread nor its CUDA state (nor its exports: the memory
 * is the parent's). */
void wl__ipc_fork_child(void) {
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  memcpy(&exp_lock, &fresh, sizeof fresh);
  memcpy(&imp_lock, &fresh, sizeof fresh);
  if (exps.tab) wl__ptrmap_clear(&exps, free);
  __atomic_store_n(&wl__ipc_nexports, 0, __ATOMIC_RELAXED);
  if (srv_fd >= 0) close(srv_fd);
  srv_fd = -1;
  nimps = 0;
  memset(iprov_state, 0, sizeof iprov_state);
}
