/* The host provider: address space and "physical memory" from mmap, so every allocator path runs
 * without a GPU. Unmapped ranges are PROT_NONE, so a use after unmap faults as it would on a GPU;
 * streams are ticket counters that tests complete by hand. */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HOST_STREAM_MAGIC 0x57484f5354524d31ull /* "WHOSTRM1" */
#define HOST_EVENT_MAGIC  0x57484f5354455631ull

typedef struct host_stream_s {
  uint64_t magic;
  uint64_t enqueued, completed; /* atomics: tests complete work from any thread */
  struct host_stream_s *next;
  bool dead;
} host_stream_t;

typedef struct host_event_s {
  uint64_t magic;
  host_stream_t *stream;
  uint64_t ticket;
} host_event_t;

typedef struct host_s {
  pthread_mutex_t lock;
  size_t capacity, used, granularity;
  host_stream_t *streams; /* live and destroyed: freed with the provider, so events stay valid */
} host_t;

static int host_reserve(void *ctx, size_t size, uintptr_t *addr) {
  host_t *h = ctx;
  size_t g = h->granularity;
  if (size > SIZE_MAX - g) return -ENOMEM;
  /* Over-reserve, then trim both ends so the base is granularity-aligned. */
  void *p = mmap(NULL, size + g, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return -errno;
  uintptr_t base = wl__align_up((uintptr_t)p, g);
  if (base > (uintptr_t)p) munmap(p, base - (uintptr_t)p);
  uintptr_t end = (uintptr_t)p + size + g;
  if (end > base + size) munmap((void *)(base + size), end - (base + size));
  *addr = base;
  return 0;
}

static int host_unreserve(void *ctx, uintptr_t addr, size_t size) {
  (void)ctx;
  return munmap((void *)addr, size) ? -errno : 0;
}

static int host_phys_create(void *ctx, size_t size, void **handle) {
  host_t *h = ctx;
  if (size == 0 || size % h->granularity) return -EINVAL;
  pthread_mutex_lock(&h->lock);
  int rc = 0;
  if (h->capacity && (size > h->capacity || h->used > h->capacity - size))
    rc = -ENOMEM;
  else
    h->used += size;
  pthread_mutex_unlock(&h->lock);
  if (rc) return rc;
  /* The handle only accounts: pages come with the mapping. Any non-NULL token will do. */
  size_t *tok = malloc(sizeof *tok);
  if (!tok) {
    pthread_mutex_lock(&h->lock);
    h->used -= size;
    pthread_mutex_unlock(&h->lock);
    return -ENOMEM;
  }
  *tok = size;
  *handle = tok;
  return 0;
}

static int host_phys_release(void *ctx, void *handle, size_t size) {
  host_t *h = ctx;
  size_t *tok = handle;
  if (!tok || *tok != size) return -EINVAL;
  pthread_mutex_lock(&h->lock);
  h->used = wl__sub_sat(h->used, size);
  pthread_mutex_unlock(&h->lock);
  free(tok);
  return 0;
}

static int host_map(void *ctx, uintptr_t addr, size_t size, void *handle) {
  host_t *h = ctx;
  if (!handle || addr % h->granularity || size % h->granularity) return -EINVAL;
  void *p = mmap((void *)addr, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? -errno : 0;
}

static int host_unmap(void *ctx, uintptr_t addr, size_t size) {
  (void)ctx;
  /* Replace with a fresh PROT_NONE mapping: the pages go, the reservation stays. */
  void *p = mmap((void *)addr, size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? -errno : 0;
}

static host_stream_t *find_stream(host_t *h, wl_stream_t stream) {
  for (host_stream_t *s = h->streams; s; s = s->next)
    if ((void *)s == stream) return s;
  return NULL;
}

static int host_stream_check(void *ctx, wl_stream_t stream) {
  host_t *h = ctx;
  if (!stream) return 0;
  pthread_mutex_lock(&h->lock);
  host_stream_t *s = find_stream(h, stream);
  int rc = s && !s->dead ? 0 : -EINVAL;
  pthread_mutex_unlock(&h->lock);
  return rc;
}

static int host_event_create(void *ctx, void **event) {
  (void)ctx;
  host_event_t *e = calloc(1, sizeof *e);
  if (!e) return -ENOMEM;
  e->magic = HOST_EVENT_MAGIC;
  *event = e;
  return 0;
}

static int host_event_destroy(void *ctx, void *event) {
  (void)ctx;
  host_event_t *e = event;
  if (!e || e->magic != HOST_EVENT_MAGIC) return -EINVAL;
  e->magic = 0;
  free(e);
  return 0;
}

static int host_event_record(void *ctx, void *event, wl_stream_t stream) {
  host_t *h = ctx;
  host_event_t *e = event;
  if (!e || e->magic != HOST_EVENT_MAGIC) return -EINVAL;
  if (host_stream_check(h, stream)) return -EINVAL;
  host_stream_t *s = stream;
  e->stream = s;
  e->ticket = s ? __atomic_load_n(&s->enqueued, __ATOMIC_ACQUIRE) : 0;
  return 0;
}

static int host_event_query(void *ctx, void *event) {
  (void)ctx;
  host_event_t *e = event;
  if (!e || e->magic != HOST_EVENT_MAGIC) return -EINVAL;
  if (!e->stream) return 0;
  return __atomic_load_n(&e->stream->completed, __ATOMIC_ACQUIRE) >= e->ticket ? 0 : -EBUSY;
}

static void host_destroy(void *ctx) {
  host_t *h = ctx;
  while (h->streams) {
    host_stream_t *s = h->streams;
    h->streams = s->next;
    s->magic = 0;
    free(s);
  }
  pthread_mutex_destroy(&h->lock);
  free(h);
}

int wl_provider_host_init(wl_provider_t *out, size_t capacity, size_t granularity) {
  if (!out) return -EINVAL;
  if (!granularity) granularity = (size_t)2 << 20;
  if (!wl__is_pow2(granularity) || granularity < 4096) {
    wl__warn("host provider: granularity %zu is not a power of two >= 4096", granularity);
    return -EINVAL;
  }
  host_t *h = calloc(1, sizeof *h);
  if (!h) return -ENOMEM;
  pthread_mutex_init(&h->lock, NULL);
  h->capacity = capacity;
  h->granularity = granularity;
  *out = (wl_provider_t){
      .name = "host",
      .ctx = h,
      .granularity = granularity,
      .capacity = capacity,
      .reserve = host_reserve,
      .unreserve = host_unreserve,
      .phys_create = host_phys_create,
      .phys_release = host_phys_release,
      .map = host_map,
      .unmap = host_unmap,
      .stream_check = host_stream_check,
      .event_create = host_event_create,
      .event_destroy = host_event_destroy,
      .event_record = host_event_record,
      .event_query = host_event_query,
      .destroy = host_destroy,
  };
  return 0;
}

wl_stream_t wl_host_stream_create(const wl_provider_t *host) {
  if (!host || host->reserve != host_reserve) return NULL;
  host_t *h = host->ctx;
  host_stream_t *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->magic = HOST_STREAM_MAGIC;
  pthread_mutex_lock(&h->lock);
  s->next = h->streams;
  h->streams = s;
  pthread_mutex_unlock(&h->lock);
  return s;
}

void wl_host_stream_destroy(const wl_provider_t *host, wl_stream_t stream) {
  if (!host || host->reserve != host_reserve || !stream) return;
  host_t *h = host->ctx;
  pthread_mutex_lock(&h->lock);
  host_stream_t *s = find_stream(h, stream);
  if (s) {
    /* Destroying a stream waits for its work, as cudaStreamDestroy lets it finish. */
    __atomic_store_n(&s->completed, UINT64_MAX, __ATOMIC_RELEASE);
    s->dead = true;
  }
  pthread_mutex_unlock(&h->lock);
}

uint64_t wl_host_stream_enqueue(wl_stream_t stream) {
  host_stream_t *s = stream;
  if (!s || s->magic != HOST_STREAM_MAGIC) return 0;
  return __atomic_add_fetch(&s->enqueued, 1, __ATOMIC_ACQ_REL);
}

void wl_host_stream_complete(wl_stream_t stream, uint64_t ticket) {
  host_stream_t *s = stream;
  if (!s || s->magic != HOST_STREAM_MAGIC) return;
  uint64_t cur = __atomic_load_n(&s->completed, __ATOMIC_ACQUIRE);
  while (cur < ticket && !__atomic_compare_exchange_n(&s->completed, &cur, ticket, 0,
                                                      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
  }
}
