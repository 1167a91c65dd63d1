/* libsched's group tests: names and options, join and leave, roles, races of joiners and
 * leavers with and without SIGKILL, a member killed holding the group lock, wrong layout
 * versions, corrupted segments (chosen fields and random bytes), permissions and fork. */
#include "sched_test.h"

#include <fcntl.h>
#include <sys/file.h>

/* Whether the kernel has OFD locks (gVisor's, and tests run with libwltest_gvisor.so, have
 * none: libsched then falls back on pid checks and flock, and these tests on what it does). */
static bool t_have_ofd(void) {
  int fd = open("/dev/null", O_RDONLY);
  struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  bool have = fd >= 0 && (fcntl(fd, F_OFD_GETLK, &fl) == 0 || errno != EINVAL);
  if (fd >= 0) close(fd);
  return have;
}

/* ---- names and options -----------------------------------------------------------------------*/

static void test_names(void) {
  CU_ASSERT_EQUAL(wl_sched_group_name_check("gpu-0"), 0);
  CU_ASSERT_EQUAL(wl_sched_group_name_check("a.b_c-D9"), 0);
  const char *bad[] = {"",
                       ".hidden",
                       "-x",
                       "a/b",
                       "a b",
                       "\xc3\xa9",
                       "0123456789012345678901234567890123456789012345678"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CU_ASSERT_EQUAL(wl_sched_group_name_check(bad[i]), -EINVAL);
  char buf[64];
  CU_ASSERT_EQUAL(wl_sched_group_name("GPU-5b9c2f1e-0a4d-4c1b-9e77-123456789ABC", buf, sizeof buf),
                  0);
  CU_ASSERT_STRING_EQUAL(buf, "gpu-5b9c2f1e0a4d4c1b9e77123456789abc");
  CU_ASSERT_EQUAL(wl_sched_group_name("not-a-uuid", buf, sizeof buf), -EINVAL);
  CU_ASSERT_EQUAL(wl_sched_group_name("GPU-", buf, sizeof buf), -EINVAL);
  CU_ASSERT_EQUAL(wl_sched_group_name("GPU-abcd", buf, 4), -ENOSPC);

  wl_sched_t *s = (wl_sched_t *)1;
  wl_sched_config_t c = t_config("bad name", 2, 0);
  CU_ASSERT_EQUAL(wl_sched_join(&s, &c), -EINVAL);
  CU_ASSERT_PTR_NULL(s);
  c.group = NULL;
  CU_ASSERT_EQUAL(wl_sched_join(&s, &c), -EINVAL);
  char uuid[64], want[64];
  snprintf(uuid, sizeof uuid, "GPU-%08x-feed-beef", (unsigned)getpid());
  snprintf(want, sizeof want, "gpu-%08xfeedbeef", (unsigned)getpid());
  c.gpu_uuid = uuid;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &c), 0);
  CU_ASSERT_STRING_EQUAL(wl_sched_group(s), want);
  CU_ASSERT_TRUE(t_shm_exists(want));
  CU_ASSERT_EQUAL(wl_sched_group_exists(want), 1);
  wl_sched_leave(s);
  CU_ASSERT_FALSE(t_shm_exists(want));
  CU_ASSERT_EQUAL(wl_sched_group_exists(want), 0);
  CU_ASSERT_EQUAL(wl_sched_group_exists("../etc"), -EINVAL);
  c = t_config("x", 1, 0);
  CU_ASSERT_EQUAL(wl_sched_join(&s, &c), -EINVAL); /* K >= 2 */
  c = t_config("x", 2, 0);
  c.role = 70;
  CU_ASSERT_EQUAL(wl_sched_join(&s, &c), -EINVAL);
  CU_ASSERT_EQUAL(wl_sched_group_remove("no-such-group-here"), -ENOENT);
  CU_ASSERT_EQUAL(wl_sched_group_remove("../etc"), -EINVAL);
}

static void test_options(void) {
  static const char *vars[] = {"WAVELET_GROUP",
                               "WAVELET_ROLE",
                               "WAVELET_WAVES",
                               "WAVELET_MEM_LIMIT",
                               "WAVELET_ALLOC_TIMEOUT_MS",
                               "WAVELET_GATE_TIMEOUT_MS"};
  for (size_t i = 0; i < 6; i++) unsetenv(vars[i]);
  wl_sched_config_t c;
  wl_sched_config_default(&c);
  CU_ASSERT_EQUAL(wl_sched_config_from_env(&c), 0);
  CU_ASSERT_PTR_NULL(c.group);
  CU_ASSERT_EQUAL(c.waves, 2);

  setenv("WAVELET_GROUP", "trainers.a", 1);
  setenv("WAVELET_ROLE", "3", 1);
  setenv("WAVELET_WAVES", "4", 1);
  setenv("WAVELET_MEM_LIMIT", "6G", 1);
  setenv("WAVELET_ALLOC_TIMEOUT_MS", "250", 1);
  setenv("WAVELET_GATE_TIMEOUT_MS", "0", 1);
  CU_ASSERT_EQUAL(wl_sched_config_from_env(&c), 0);
  CU_ASSERT_STRING_EQUAL(c.group, "trainers.a");
  CU_ASSERT_EQUAL(c.role, 3);
  CU_ASSERT_EQUAL(c.waves, 4);
  CU_ASSERT_EQUAL(c.mem_limit, (size_t)6 << 30);
  CU_ASSERT_EQUAL(c.alloc_timeout_ms, 250);
  CU_ASSERT_EQUAL(c.gate_timeout_ms, 0);

  setenv("WAVELET_MEM_LIMIT", "50%", 1);
  CU_ASSERT_EQUAL(wl_sched_config_from_env(&c), 0);
  CU_ASSERT_EQUAL(c.mem_limit, WL_SCHED_MEM_DEFAULT);
  CU_ASSERT_EQUAL(c.mem_limit_percent, 50);
  c.device_memory = (size_t)16 << 30;
  CU_ASSERT_EQUAL(wl__resolve_limit(&c), (size_t)8 << 30);
  /* Every percentage exactly: a double product read 29%, 57% and 58% as one less. */
  int pct_bad = 0;
  for (unsigned p = 1; p <= 100; p++) {
    char v[8];
    snprintf(v, sizeof v, "%u%%", p);
    setenv("WAVELET_MEM_LIMIT", v, 1);
    c.device_memory = 100;
    if (wl_sched_config_from_env(&c) || c.mem_limit_percent != p || wl__resolve_limit(&c) != p)
      pct_bad++;
    c.device_memory = (size_t)141 << 30; /* an H200 */
    if (wl__resolve_limit(&c) != (size_t)(((unsigned __int128)141 << 30) * p / 100)) pct_bad++;
  }
  CU_ASSERT_EQUAL(pct_bad, 0);
  setenv("WAVELET_MEM_LIMIT", "0", 1);
  CU_ASSERT_EQUAL(wl_sched_config_from_env(&c), 0);
  CU_ASSERT_EQUAL(wl__resolve_limit(&c), 0);

  /* Every bad value is refused and the field keeps its value. */
  struct {
    const char *var, *val;
  } bad[] = {{"WAVELET_GROUP", "a b"},
             {"WAVELET_ROLE", "64"},
             {"WAVELET_ROLE", "-1"},
             {"WAVELET_WAVES", "1"},
             {"WAVELET_WAVES", "abc"},
             {"WAVELET_WAVES", "65"},
             {"WAVELET_MEM_LIMIT", "150%"},
             {"WAVELET_MEM_LIMIT", "12Q"},
             {"WAVELET_MEM_LIMIT", "0%"},
             {"WAVELET_ALLOC_TIMEOUT_MS", "1e3"},
             {"WAVELET_GATE_TIMEOUT_MS", "-5"},
             {"WAVELET_GATE_TIMEOUT_MS", "99999999999"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    for (size_t k = 0; k < 6; k++) unsetenv(vars[k]);
    wl_sched_config_t before;
    wl_sched_config_default(&before);
    before.group = "kept";
    wl_sched_config_t after = before;
    setenv(bad[i].var, bad[i].val, 1);
    CU_ASSERT_EQUAL(wl_sched_config_from_env(&after), -EINVAL);
    CU_ASSERT_EQUAL(memcmp(&before, &after, sizeof before), 0);
  }
  for (size_t i = 0; i < 6; i++) unsetenv(vars[i]);

  /* The default limit: device memory minus a margin. */
  wl_sched_config_default(&c);
  c.device_memory = (size_t)16 << 30;
  size_t lim = wl__resolve_limit(&c);
  CU_ASSERT_TRUE(lim < c.device_memory && lim >= c.device_memory - c.device_memory / 10);
  c.device_memory = 0;
  CU_ASSERT_EQUAL(wl__resolve_limit(&c), 0);
}

/* ---- join and leave ------------------------------------------------------------------------*/

/* wl_sched_peek: the budget a join would meet, without joining: the limit the configuration
 * would give a new group, then the group's own limit and use once it exists (not the asker's). */
static void test_peek(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 2, 64 * MiB);
  size_t limit = 1, used = 1;
  CU_ASSERT_EQUAL(wl_sched_peek(&c, &limit, &used), 0);
  CU_ASSERT_EQUAL(limit, 64 * MiB);
  CU_ASSERT_EQUAL(used, 0);
  CU_ASSERT_EQUAL(wl_sched_group_exists(g), 0); /* peeking made nothing */
  wl_sched_t *s = NULL;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &c), 0);
  CU_ASSERT_EQUAL(wl_sched_acquire(s, 10 * MiB, 0), 0);
  wl_sched_config_t other = t_config(g, 2, 512 * MiB);
  CU_ASSERT_EQUAL(wl_sched_peek(&other, &limit, &used), 0);
  CU_ASSERT_EQUAL(limit, 64 * MiB);
  CU_ASSERT_EQUAL(used, 10 * MiB);
  wl_sched_release(s, 10 * MiB);
  wl_sched_leave(s);
  wl_sched_group_remove(g);
  wl_sched_config_t none;
  wl_sched_config_default(&none);
  CU_ASSERT_EQUAL(wl_sched_peek(&none, &limit, &used), -EINVAL); /* no group to name */
  CU_ASSERT_EQUAL(wl_sched_peek(NULL, &limit, &used), -EINVAL);
}

static void test_join_leave(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 3, 64 * MiB);
  wl_sched_t *s;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &c), 0);
  CU_ASSERT_EQUAL(wl_sched_status(s), 0);
  CU_ASSERT_EQUAL(wl_sched_role(s), 0);
  CU_ASSERT_EQUAL(wl_sched_waves(s), 3);
  CU_ASSERT_EQUAL(wl_sched_limit(s), 64 * MiB);
  char path[128];
  snprintf(path, sizeof path, "/dev/shm/wavelet-%s", g);
  struct stat st;
  CU_ASSERT_EQUAL_FATAL(stat(path, &st), 0);
  CU_ASSERT_EQUAL(st.st_mode & 0777, 0600);
  CU_ASSERT_EQUAL(st.st_uid, geteuid());
  CU_ASSERT_EQUAL(t_members(s), 1);
  wl_sched_stats_t stt;
  wl_sched_stats_get(s, &stt);
  CU_ASSERT_EQUAL(stt.members, 1);
  CU_ASSERT_EQUAL(stt.limit, 64 * MiB);
  /* A second member in the same process is a member like any other. */
  wl_sched_t *s2;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s2, &c), 0);
  CU_ASSERT_EQUAL(wl_sched_role(s2), 1);
  CU_ASSERT_EQUAL(t_members(s), 2);
  wl_sched_leave(s);
  CU_ASSERT_TRUE(t_shm_exists(g)); /* s2 is still a member */
  CU_ASSERT_EQUAL(t_members(s2), 1);
  wl_sched_leave(s2);
  CU_ASSERT_FALSE(t_shm_exists(g));
}

typedef struct member_arg_s {
  const char *group;
  int role;
  unsigned waves;
  size_t limit;
  unsigned flags;
  const char *gpu; /* the member's GPU UUID, NULL: none */
} member_arg_t;

/* Joins, reports 'j' and its role (or 'e' and the error), then waits for 'q' and leaves. */
static int child_member(int up, int down, void *argp) {
  member_arg_t *a = argp;
  wl_sched_config_t c = t_config(a->group, a->waves, a->limit);
  c.role = a->role;
  c.flags = a->flags;
  c.gpu_uuid = a->gpu;
  wl_sched_t *s;
  int rc = wl_sched_join(&s, &c);
  if (rc) {
    t_note(up, 'e');
    t_note(up, (char)-rc);
    return 1;
  }
  t_note(up, 'j');
  t_note(up, (char)wl_sched_role(s));
  t_read(down, 60000);
  wl_sched_leave(s);
  return 0;
}

static void test_roles(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 2, 0);
  wl_sched_t *a;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&a, &c), 0);
  CU_ASSERT_EQUAL(wl_sched_role(a), 0);
  member_arg_t arg = {g, -1, 2, 0, 0, NULL};
  t_child_t b = t_spawn(child_member, &arg);
  CU_ASSERT_EQUAL(t_read(b.up, 10000), 'j');
  CU_ASSERT_EQUAL(t_read(b.up, 10000), 1); /* the next free role */
  /* Taken, out of range, and full. */
  wl_sched_t *x = NULL;
  c.role = 1;
  CU_ASSERT_EQUAL(wl_sched_join(&x, &c), -EEXIST);
  c.role = 5;
  CU_ASSERT_EQUAL(wl_sched_join(&x, &c), -ERANGE);
  c.role = -1;
  CU_ASSERT_EQUAL(wl_sched_join(&x, &c), -EBUSY);
  CU_ASSERT_PTR_NULL(x);
  CU_ASSERT_EQUAL(wl_sched_set_role(a, 1), -EEXIST);
  CU_ASSERT_EQUAL(wl_sched_set_role(a, 2), -ERANGE);
  t_note(b.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&b, 10000), 0);
  CU_ASSERT_EQUAL(wl_sched_set_role(a, 1), 0);
  CU_ASSERT_EQUAL(wl_sched_role(a), 1);
  /* The freed role 0 goes to the next joiner. */
  t_child_t d = t_spawn(child_member, &arg);
  CU_ASSERT_EQUAL(t_read(d.up, 10000), 'j');
  CU_ASSERT_EQUAL(t_read(d.up, 10000), 0);
  t_note(d.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&d, 10000), 0);
  wl_sched_leave(a);
  CU_ASSERT_FALSE(t_shm_exists(g));
}

/* A group is one GPU's: a joiner naming another GPU than the live members is refused with
 * -EXDEV, whatever the UUID's spelling; one naming none is let in; the first to name one stamps
 * an unstamped group; a group whose members all died is taken over by another GPU's joiner. */
static void test_one_gpu_per_group(void) {
  const char *gpu_a = "GPU-00112233-4455-6677-8899-aabbccddeeff";
  const char *gpu_a2 = "00112233445566778899AABBCCDDEEFF";
  const char *gpu_b = "GPU-ffeeddcc-bbaa-9988-7766-554433221100";
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 4, 0);
  wl_sched_t *none, *a, *a2, *x = NULL;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&none, &c), 0); /* unstamped */
  c.gpu_uuid = gpu_a;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&a, &c), 0); /* stamps it */
  c.gpu_uuid = gpu_a2;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&a2, &c), 0);
  c.gpu_uuid = gpu_b;
  CU_ASSERT_EQUAL(wl_sched_join(&x, &c), -EXDEV);
  CU_ASSERT_PTR_NULL(x);
  CU_ASSERT_EQUAL(t_members(a), 3);
  wl_sched_leave(a);
  wl_sched_leave(a2);
  /* Still stamped while a member (even one that named no GPU) is live. */
  CU_ASSERT_EQUAL(wl_sched_join(&x, &c), -EXDEV);
  wl_sched_leave(none);
  CU_ASSERT_FALSE(t_shm_exists(g));
  /* A member of GPU A killed: its dead slot does not hold the group for A. */
  member_arg_t arg = {g, -1, 4, 0, 0, gpu_a};
  t_child_t k = t_spawn(child_member, &arg);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'j');
  t_read(k.up, 10000);
  CU_ASSERT_EQUAL(wl_sched_join(&x, &c), -EXDEV);
  t_kill(&k);
  t_wait(&k, 10000);
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&x, &c), 0);
  c.gpu_uuid = gpu_a;
  wl_sched_t *y = NULL;
  CU_ASSERT_EQUAL(wl_sched_join(&y, &c), -EXDEV);
  CU_ASSERT_PTR_NULL(y);
  wl_sched_leave(x);
  CU_ASSERT_FALSE(t_shm_exists(g));
  /* The groups of a process on several GPUs go with their name; a longer name does not. */
  char dotted[96], longer[96];
  snprintf(dotted, sizeof dotted, "%s.0badf00d", g);
  snprintf(longer, sizeof longer, "%sx", g);
  const char *names[] = {g, dotted, longer};
  wl_sched_t *m[3];
  for (int i = 0; i < 3; i++) {
    wl_sched_config_t ci = t_config(names[i], 2, 0);
    CU_ASSERT_EQUAL_FATAL(wl_sched_join(&m[i], &ci), 0);
  }
  CU_ASSERT_EQUAL(wl_sched_group_remove_all(g), 0);
  CU_ASSERT_FALSE(t_shm_exists(g));
  CU_ASSERT_FALSE(t_shm_exists(dotted));
  CU_ASSERT_TRUE(t_shm_exists(longer));
  CU_ASSERT_EQUAL(wl_sched_group_remove_all(g), -ENOENT);
  CU_ASSERT_EQUAL(wl_sched_group_remove_all("../x"), -EINVAL);
  for (int i = 0; i < 3; i++) wl_sched_leave(m[i]);
  CU_ASSERT_FALSE(t_shm_exists(longer));
}

/* Opens group g's file (made empty when missing; its path in path[128]) and takes its naming
 * lock as a WL_SCHED_GPU_ALT joiner would: 0, or -1 with errno (EINVAL: no OFD locks). */
static int naming_lock_take(const char *g, char *path, int *fd) {
  snprintf(path, 128, "/dev/shm/wavelet-%s", g);
  *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  CU_ASSERT_FATAL(*fd >= 0);
  struct flock fl = {
      .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = WL__LOCK_NAMING, .l_len = 1};
  return fcntl(*fd, F_OFD_SETLK, &fl);
}

/* The GPU's own group under a name (WL_SCHED_GPU_ALT, wl_sched_group_gpu_name): one name for
 * every spelling of the UUID, the name shortened to fit; a joiner goes there when the name is
 * another GPU's, and first whenever it exists; and the choice waits for the naming lock and is
 * made after it: a joiner that would take the free name joins instead the GPU's own group that
 * another process made while the lock was held. (Before the lock, a joiner could look for the
 * GPU's group, find none, and take the name just freed by another GPU's members, while a process
 * of its GPU that had found the name taken made the GPU's group: one GPU, two budgets.) */
static void test_gpu_alt(void) {
  const char *gpu_a = "GPU-00112233-4455-6677-8899-aabbccddeeff";
  const char *gpu_b = "GPU-ffeeddcc-bbaa-9988-7766-554433221100";
  const char *gpu_b2 = "FFEEDDCCBBAA99887766554433221100";
  char g[64], alt[WL_SCHED_GROUP_MAX + 1], alt2[WL_SCHED_GROUP_MAX + 1];
  t_group(g, sizeof g);
  CU_ASSERT_EQUAL_FATAL(wl_sched_group_gpu_name(g, gpu_b, alt, sizeof alt), 0);
  CU_ASSERT_EQUAL(wl_sched_group_gpu_name(g, gpu_b2, alt2, sizeof alt2), 0);
  CU_ASSERT_STRING_EQUAL(alt, alt2);
  CU_ASSERT_EQUAL(strncmp(alt, g, strlen(g)), 0);
  CU_ASSERT_EQUAL(alt[strlen(g)], '.');
  CU_ASSERT_EQUAL(strlen(alt), strlen(g) + 9);
  CU_ASSERT_EQUAL(wl_sched_group_gpu_name(g, gpu_a, alt2, sizeof alt2), 0);
  CU_ASSERT_STRING_NOT_EQUAL(alt, alt2);
  char longest[WL_SCHED_GROUP_MAX + 1];
  memset(longest, 'n', WL_SCHED_GROUP_MAX);
  longest[WL_SCHED_GROUP_MAX] = 0;
  CU_ASSERT_EQUAL(wl_sched_group_gpu_name(longest, gpu_b, alt2, sizeof alt2), 0);
  CU_ASSERT_EQUAL(strlen(alt2), WL_SCHED_GROUP_MAX);
  CU_ASSERT_EQUAL(wl_sched_group_name_check(alt2), 0);
  CU_ASSERT_EQUAL(wl_sched_group_gpu_name(g, "GPU-zz", alt2, sizeof alt2), -EINVAL);
  CU_ASSERT_EQUAL(wl_sched_group_gpu_name("../x", gpu_b, alt2, sizeof alt2), -EINVAL);
  CU_ASSERT_EQUAL(wl_sched_group_gpu_name(g, gpu_b, alt2, 8), -ENOSPC);

  /* The name is GPU A's: B's joiner goes to B's group; with A gone, B's group is still first. */
  wl_sched_config_t c = t_config(g, 4, 0);
  c.gpu_uuid = gpu_a;
  wl_sched_t *a, *b, *b2;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&a, &c), 0);
  c.gpu_uuid = gpu_b;
  c.flags = WL_SCHED_GPU_ALT;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&b, &c), 0);
  CU_ASSERT_STRING_EQUAL(wl_sched_group(b), alt);
  wl_sched_leave(a);
  c.gpu_uuid = gpu_b2;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&b2, &c), 0);
  CU_ASSERT_STRING_EQUAL(wl_sched_group(b2), alt);
  wl_sched_leave(b2);
  wl_sched_leave(b);
  CU_ASSERT_FALSE(t_shm_exists(alt));
  /* Free: the name is taken. */
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&b, &c), 0);
  CU_ASSERT_STRING_EQUAL(wl_sched_group(b), g);
  wl_sched_leave(b);
  CU_ASSERT_FALSE(t_shm_exists(g));

  /* The naming lock, held here while a joiner of GPU B starts: the name is free, so were the
   * joiner to look before the lock it would take the name. B's group is made meanwhile. */
  char path[128];
  int fd;
  if (naming_lock_take(g, path, &fd) != 0) {
    CU_ASSERT_EQUAL(errno, EINVAL); /* no OFD locks (gVisor): no naming lock to test */
    close(fd);
    unlink(path);
    return;
  }
  member_arg_t arg = {g, -1, 4, 0, WL_SCHED_GPU_ALT, gpu_b};
  t_child_t k = t_spawn(child_member, &arg);
  CU_ASSERT_EQUAL(t_read(k.up, 300), -1); /* waits for the lock */
  wl_sched_config_t cb = t_config(alt, 4, 0);
  cb.gpu_uuid = gpu_b;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&b, &cb), 0);
  close(fd); /* drops the lock */
  CU_ASSERT_EQUAL(t_read(k.up, 10000), 'j');
  t_read(k.up, 10000);
  wl_sched_group_info_t info;
  wl_sched_member_t m[4];
  CU_ASSERT_EQUAL(wl_sched_inspect(alt, &info, m, 4), 2);
  CU_ASSERT_NOT_EQUAL(wl_sched_inspect(g, &info, m, 4), 1);
  t_note(k.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 0);
  wl_sched_leave(b);
  CU_ASSERT_FALSE(t_shm_exists(alt));
  unlink(path);
}

/* wl_sched_group_prune removes a group whose members are all dead, or a file left empty, and
 * never one with a live member; and a joiner that opened a group's file before it was removed
 * joins the group under its name, a new file, not the removed one nobody else can find. */
static void test_prune(void) {
  char g[64];
  t_group(g, sizeof g);
  CU_ASSERT_EQUAL(wl_sched_group_prune(g), -ENOENT);
  CU_ASSERT_EQUAL(wl_sched_group_prune("../x"), -EINVAL);
  wl_sched_config_t c = t_config(g, 2, 0);
  wl_sched_t *a;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&a, &c), 0);
  CU_ASSERT_EQUAL(wl_sched_group_prune(g), -EBUSY);
  CU_ASSERT_TRUE(t_shm_exists(g));
  wl_sched_leave(a);
  /* Every member killed. */
  member_arg_t arg = {g, -1, 2, 0, 0, NULL};
  t_child_t k = t_spawn(child_member, &arg);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'j');
  t_read(k.up, 10000);
  CU_ASSERT_EQUAL(wl_sched_group_prune(g), -EBUSY);
#ifdef WL_WAVELET_RUN
  /* wavelet-run --groups --prune: a named group kept is one line and exit 1; a dead one goes. */
  char cmd[256], out[256] = "";
  snprintf(cmd, sizeof cmd, "%s --groups --prune %s 2>&1", WL_WAVELET_RUN, g);
  FILE *pf = popen(cmd, "r");
  CU_ASSERT_PTR_NOT_NULL_FATAL(pf);
  out[fread(out, 1, sizeof out - 1, pf)] = 0;
  CU_ASSERT_EQUAL(WEXITSTATUS(pclose(pf)), 1);
  CU_ASSERT_PTR_NOT_NULL(strstr(out, "kept: a member is alive"));
  CU_ASSERT_TRUE(t_shm_exists(g));
#endif
  t_kill(&k);
  t_wait(&k, 10000);
  CU_ASSERT_TRUE(t_shm_exists(g));
#ifdef WL_WAVELET_RUN
  snprintf(cmd, sizeof cmd, "%s --groups --json --prune %s", WL_WAVELET_RUN, g);
  pf = popen(cmd, "r");
  CU_ASSERT_PTR_NOT_NULL_FATAL(pf);
  out[fread(out, 1, sizeof out - 1, pf)] = 0;
  CU_ASSERT_EQUAL(pclose(pf), 0);
  char want[128];
  snprintf(want, sizeof want, "{\"removed\":[\"%s\"]}\n", g);
  CU_ASSERT_STRING_EQUAL(out, want);
#else
  CU_ASSERT_EQUAL(wl_sched_group_prune(g), 0);
#endif
  CU_ASSERT_FALSE(t_shm_exists(g));
  /* An empty file (a joiner killed before it sized the segment); not removed while a joiner
   * holds the naming lock on it (WL_SCHED_GPU_ALT's choice). */
  char path[128];
  int fd;
  if (naming_lock_take(g, path, &fd) == 0) {
    CU_ASSERT_EQUAL(wl_sched_group_prune(g), -EBUSY);
    struct flock fl = {
        .l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = WL__LOCK_NAMING, .l_len = 1};
    fcntl(fd, F_OFD_SETLK, &fl);
  }
  CU_ASSERT_EQUAL(wl_sched_group_prune(g), 0);
  CU_ASSERT_FALSE(t_shm_exists(g));
  close(fd);

  /* A joiner waits for the init lock held here on a dead group's file, which is then removed. */
  k = t_spawn(child_member, &arg);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'j');
  t_read(k.up, 10000);
  t_kill(&k);
  t_wait(&k, 10000);
  fd = open(path, O_RDWR | O_CLOEXEC);
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_EQUAL_FATAL(wl__life_lock(fd), 0);
  t_child_t j = t_spawn(child_member, &arg);
  CU_ASSERT_EQUAL(t_read(j.up, 200), -1); /* waits for the init lock */
  CU_ASSERT_EQUAL(unlink(path), 0);
  wl__life_unlock(fd);
  close(fd);
  CU_ASSERT_EQUAL(t_read(j.up, 10000), 'j');
  CU_ASSERT_EQUAL(t_read(j.up, 10000), 0);
  wl_sched_group_info_t info;
  CU_ASSERT_EQUAL(wl_sched_inspect(g, &info, NULL, 0), 1); /* under the name */
  CU_ASSERT_EQUAL(info.dead, 0);
  t_note(j.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&j, 10000), 0);
  CU_ASSERT_FALSE(t_shm_exists(g));
}

/* A group seen without joining it (wl_sched_inspect, and wavelet-run --groups over it): its GPU,
 * budget, token and live members, then a killed member counted as dead. */
static void test_inspect(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_group_info_t info;
  wl_sched_member_t m[8];
  CU_ASSERT_EQUAL(wl_sched_inspect(g, &info, m, 8), -ENOENT);
  CU_ASSERT_EQUAL(wl_sched_inspect("../x", &info, m, 8), -EINVAL);
  wl_sched_config_t c = t_config(g, 2, 64 * MiB);
  c.gpu_uuid = "GPU-00112233-4455-6677-8899-aabbccddeeff";
  wl_sched_t *s;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &c), 0);
  CU_ASSERT_EQUAL(wl_sched_acquire(s, 8 * MiB, 0), 0);
  CU_ASSERT_EQUAL(wl_gate_enter(s), WL_GATE_HELD);
  member_arg_t arg = {g, -1, 2, 64 * MiB, 0, NULL};
  t_child_t k = t_spawn(child_member, &arg);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'j');
  CU_ASSERT_EQUAL(t_read(k.up, 10000), 1);
  CU_ASSERT_EQUAL(wl_sched_inspect(g, &info, m, 8), 2);
  CU_ASSERT_STRING_EQUAL(info.group, g);
  CU_ASSERT_STRING_EQUAL(info.gpu, "gpu-00112233445566778899aabbccddeeff");
  CU_ASSERT_EQUAL(info.members, 2);
  CU_ASSERT_EQUAL(info.dead, 0);
  CU_ASSERT_EQUAL(info.waves, 2);
  CU_ASSERT_EQUAL(info.limit, 64 * MiB);
  CU_ASSERT_EQUAL(info.used, 8 * MiB);
  CU_ASSERT_EQUAL(info.token_role, 0);
  int mine = m[0].pid == getpid() ? 0 : 1;
  CU_ASSERT_EQUAL(m[mine].pid, getpid());
  CU_ASSERT_EQUAL(m[mine].holds_token, 1);
  CU_ASSERT_EQUAL(m[mine].physical_bytes, 8 * MiB);
  CU_ASSERT_EQUAL(m[1 - mine].pid, k.pid);
  CU_ASSERT_EQUAL(m[1 - mine].role, 1);
  CU_ASSERT_EQUAL(wl_sched_inspect(g, &info, m, 1), 2); /* counts past cap */
  t_kill(&k);
  t_wait(&k, 10000);
  CU_ASSERT_EQUAL(wl_sched_inspect(g, &info, m, 8), 1);
  CU_ASSERT_EQUAL(info.dead, 1);
#ifdef WL_WAVELET_RUN
  char cmd[256], out[2048] = "";
  snprintf(cmd, sizeof cmd, "%s --groups %s", WL_WAVELET_RUN, g);
  FILE *p = popen(cmd, "r");
  CU_ASSERT_PTR_NOT_NULL_FATAL(p);
  size_t got = fread(out, 1, sizeof out - 1, p);
  out[got] = 0;
  CU_ASSERT_EQUAL(pclose(p), 0);
  char want[256];
  snprintf(want, sizeof want,
           "group %s on gpu-00112233445566778899aabbccddeeff: 1 member, 2 waves, budget 64.0 MiB, "
           "used 8.0 MiB, token held by role 0, 1 dead not yet reclaimed\n",
           g);
  CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
  CU_ASSERT_PTR_NOT_NULL(strstr(out, "holds the token"));
  if (!strstr(out, want)) fprintf(stderr, "%s", out);
  snprintf(cmd, sizeof cmd, "%s --groups --json %s", WL_WAVELET_RUN, g);
  p = popen(cmd, "r");
  CU_ASSERT_PTR_NOT_NULL_FATAL(p);
  got = fread(out, 1, sizeof out - 1, p);
  out[got] = 0;
  CU_ASSERT_EQUAL(pclose(p), 0);
  snprintf(want, sizeof want,
           "{\"groups\":[{\"group\":\"%s\",\"gpu\":\"gpu-00112233445566778899aabbccddeeff\","
           "\"waves\":2,\"limit_bytes\":%zu,\"used_bytes\":%zu,\"token_role\":0,"
           "\"live_members\":1,\"dead\":1,",
           g, (size_t)(64 * MiB), (size_t)(8 * MiB));
  CU_ASSERT_EQUAL(strncmp(out, want, strlen(want)), 0);
  CU_ASSERT_PTR_NOT_NULL(strstr(out, "\"holds_token\":true}]}]}\n"));
  if (strncmp(out, want, strlen(want))) fprintf(stderr, "%s", out);
#endif
  wl_gate_release(s);
  wl_sched_release(s, 8 * MiB);
  wl_sched_leave(s);
  CU_ASSERT_FALSE(t_shm_exists(g));
}

static void test_settings_adopted(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 3, 64 * MiB);
  c.gate_timeout_ms = 777;
  wl_sched_t *a, *b;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&a, &c), 0);
  wl_sched_config_t c2 = t_config(g, 2, 1 * MiB);
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&b, &c2), 0);
  CU_ASSERT_EQUAL(wl_sched_waves(b), 3);
  CU_ASSERT_EQUAL(wl_sched_limit(b), 64 * MiB);
  CU_ASSERT_EQUAL(b->gate_timeout_ms, 777);
  CU_ASSERT_EQUAL(wl_sched_set_limit(b, 32 * MiB), 0);
  CU_ASSERT_EQUAL(wl_sched_limit(a), 32 * MiB);
  wl_sched_leave(b);
  wl_sched_leave(a);
}

/* ---- races -----------------------------------------------------------------------------------*/

typedef struct race_arg_s {
  const char *group;
  int iterations;
} race_arg_t;

/* Joins and leaves in a loop, using the ledger and the gate while a member. */
static int child_race(int up, int down, void *argp) {
  race_arg_t *a = argp;
  for (int i = 0; i < a->iterations; i++) {
    wl_sched_config_t c = t_config(a->group, 16, 8 * MiB);
    wl_sched_t *s;
    int rc = wl_sched_join(&s, &c);
    if (rc) return 10 + (-rc % 100);
    if (i == 0) t_note(up, 'j');
    if (wl_sched_acquire(s, MiB, wl__now_ns() + 50 * MS_NS) == 0) wl_sched_release(s, MiB);
    if (wl_gate_enter(s) == WL_GATE_HELD) wl_gate_release(s);
    if (wl_sched_status(s)) return 2;
    wl_sched_leave(s);
  }
  return 0;
}

static void test_join_leave_race(void) {
  char g[64];
  t_group(g, sizeof g);
  race_arg_t arg = {g, 25};
  t_child_t k[8];
  for (int i = 0; i < 8; i++) k[i] = t_spawn(child_race, &arg);
  int ok = 0;
  for (int i = 0; i < 8; i++) ok += t_wait(&k[i], 60000) == 0;
  CU_ASSERT_EQUAL(ok, 8);
  /* The last leaver removed the segment. */
  CU_ASSERT_FALSE(t_shm_exists(g));
}

static void test_join_leave_race_killed(void) {
  char g[64];
  t_group(g, sizeof g);
  race_arg_t arg = {g, 100000};
  t_child_t k[6];
  for (int i = 0; i < 6; i++) k[i] = t_spawn(child_race, &arg);
  for (int i = 0; i < 6; i++) CU_ASSERT_EQUAL(t_read(k[i].up, 20000), 'j');
  /* SIGKILL them one by one at arbitrary instants: inside join, leave, the ledger, the gate. */
  unsigned seed = 12345;
  for (int i = 0; i < 6; i++) {
    t_sleep_ms(5 + rand_r(&seed) % 40);
    t_kill(&k[i]);
    CU_ASSERT_EQUAL(t_wait(&k[i], 10000), 128 + SIGKILL);
  }
  /* A newcomer finds a consistent group: only itself, no credit, no stale token. */
  wl_sched_config_t c = t_config(g, 16, 8 * MiB);
  wl_sched_t *s;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &c), 0);
  CU_ASSERT_EQUAL(t_members(s), 1);
  wl__shm_t *h = wl__test_shm(s);
  CU_ASSERT_EQUAL(WL_LD(h->used), 0);
  CU_ASSERT_EQUAL(WL_LD(h->ledger_waiters), 0);
  CU_ASSERT_TRUE(WL_LD(h->token) == 0);
  CU_ASSERT_EQUAL(wl_gate_enter(s), WL_GATE_HELD);
  CU_ASSERT_EQUAL(wl_sched_acquire(s, 8 * MiB, 0), 0);
  /* both at once: nothing waited for the dead */
  wl_sched_stats_t st;
  wl_sched_stats_get(s, &st);
  CU_ASSERT_EQUAL(st.gate_waits, 0);
  CU_ASSERT_EQUAL(st.ledger_waits, 0);
  wl_sched_release(s, 8 * MiB);
  CU_ASSERT_EQUAL(wl_gate_release(s), 0);
  CU_ASSERT_EQUAL(wl_sched_status(s), 0);
  wl_sched_leave(s);
  CU_ASSERT_FALSE(t_shm_exists(g));
}

/* ---- a member killed holding the group lock ------------------------------------------------*/

static int child_lock_holder(int up, int down, void *argp) {
  member_arg_t *a = argp;
  wl_sched_config_t c = t_config(a->group, 2, a->limit);
  wl_sched_t *s;
  if (wl_sched_join(&s, &c)) return 1;
  if (wl_sched_acquire(s, 4 * MiB, 0)) return 2;
  if (wl_gate_enter(s) != WL_GATE_HELD) return 3;
  if (wl__lock(s)) return 4;
  t_note(up, 'L');
  for (;;) pause();
}

/* A member that has cleared its own slot and still holds the group lock, as wl_sched_leave does
 * before it unlocks: its lock is not taken over while it runs. Without OFD locks (the _gvisor
 * variant) its slot's pid reads 0 then, and a waiter took the lock from the live leaver, whose
 * unlock then let go of the waiter's lock too. The leaver notes in shared memory that it is
 * about to unlock; the waiter, once it has the lock, must find the note. */
typedef struct leaver_arg_s {
  const char *group;
  int *unlocking; /* MAP_SHARED: set by the leaver just before its unlock */
} leaver_arg_t;

static int child_slow_leaver(int up, int down, void *argp) {
  leaver_arg_t *a = argp;
  wl_sched_config_t c = t_config(a->group, 2, 0);
  wl_sched_t *s;
  if (wl_sched_join(&s, &c) || wl__lock(s)) return 1;
  wl__slot_clear(s, s->slot);
  t_note(up, 'c');
  t_sleep_ms(400); /* a leaver slowed down (preempted) before its unlock: a taker's window */
  __atomic_store_n(a->unlocking, 1, __ATOMIC_SEQ_CST);
  wl__unlock(s);
  t_read(down, 10000);
  return 0;
}

static void test_lock_held_by_leaver(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 2, 0);
  wl_sched_t *b;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&b, &c), 0);
  int *unlocking =
      mmap(NULL, sizeof *unlocking, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CU_ASSERT_FATAL(unlocking != MAP_FAILED);
  *unlocking = 0;
  leaver_arg_t arg = {g, unlocking};
  t_child_t k = t_spawn(child_slow_leaver, &arg);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'c');
  CU_ASSERT_EQUAL(wl_sched_acquire(b, MiB, 0), 0);
  /* it had the group lock only after the leaver's unlock */
  CU_ASSERT_EQUAL(__atomic_load_n(unlocking, __ATOMIC_SEQ_CST), 1);
  wl_sched_release(b, MiB);
  CU_ASSERT_EQUAL(wl_sched_status(b), 0);
  t_note(k.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 0);
  CU_ASSERT_EQUAL(t_members(b), 1);
  wl_sched_leave(b);
  munmap(unlocking, sizeof *unlocking);
  CU_ASSERT_FALSE(t_shm_exists(g));
}

/* A member whose /proc entry this process cannot see (proc mounted with hidepid=2, another
 * user's process: the _gvisor variant's shim hides it so on demand, and its pid check has no OFD
 * locks to go by) is alive while kill(2) finds its pid. It read as dead before: its slot,
 * bookings and token went to others while it ran. */
static int child_hidden_member(int up, int down, void *arg) {
  wl_sched_config_t c = t_config(arg, 2, 16 * MiB);
  wl_sched_t *s;
  if (wl_sched_join(&s, &c) || wl_sched_acquire(s, 8 * MiB, 0)) return 1;
  t_note(up, 'j');
  t_read(down, 10000);
  wl_sched_release(s, 8 * MiB);
  wl_sched_leave(s);
  return 0;
}

static void test_member_hidden_in_proc(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 2, 16 * MiB);
  wl_sched_t *b;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&b, &c), 0);
  t_child_t k = t_spawn(child_hidden_member, g);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'j');
  setenv("WLTEST_PROC_HIDDEN", "1", 1);
  wl_sched_member_t m;
  CU_ASSERT_TRUE(t_member(b, k.pid, &m));
  CU_ASSERT_EQUAL(t_members(b), 2);
  /* Its 8 MiB stay booked: 8 MiB more fit, 9 do not. */
  CU_ASSERT_EQUAL(wl_sched_acquire(b, 9 * MiB, 0), -ENOMEM);
  CU_ASSERT_EQUAL(wl_sched_acquire(b, 8 * MiB, 0), 0);
  wl_sched_release(b, 8 * MiB);
  unsetenv("WLTEST_PROC_HIDDEN");
  t_note(k.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 0);
  CU_ASSERT_EQUAL(t_members(b), 1);
  CU_ASSERT_EQUAL(wl_sched_status(b), 0);
  wl_sched_leave(b);
  CU_ASSERT_FALSE(t_shm_exists(g));
}

static void test_kill_holding_lock(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 2, 8 * MiB);
  wl_sched_t *s;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &c), 0);
  member_arg_t arg = {g, -1, 2, 8 * MiB, 0, NULL};
  t_child_t k = t_spawn(child_lock_holder, &arg);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'L');
  wl__shm_t *h = wl__test_shm(s);
  CU_ASSERT_NOT_EQUAL(WL_LD(h->lock_word), 0); /* really held */
  t_kill(&k);
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 128 + SIGKILL);
  /* The whole budget and the token come back, and nothing waits for the dead holder: its lock
   * taken over, its slot reaped (the deadline is a hang guard). */
  CU_ASSERT_EQUAL(wl_sched_acquire(s, 8 * MiB, wl__now_ns() + 30 * SEC_NS), 0);
  CU_ASSERT_EQUAL(wl_gate_enter(s), WL_GATE_HELD);
  CU_ASSERT_EQUAL(t_members(s), 1);
  CU_ASSERT_EQUAL(wl_sched_status(s), 0);
  wl_sched_stats_t st;
  wl_sched_stats_get(s, &st);
  CU_ASSERT_EQUAL(st.group_reaped, 1);
  CU_ASSERT_EQUAL(st.gate_waits, 0);
  CU_ASSERT_EQUAL(st.group_revocations, 0);
  wl_gate_release(s);
  wl_sched_release(s, 8 * MiB);
  wl_sched_leave(s);
  CU_ASSERT_FALSE(t_shm_exists(g));
}

/* A process killed in the middle of joining: it holds the init lock and the group lock as a
 * joiner (it has no slot yet). Done by hand here, at exactly that point. */
static int child_joiner_holder(int up, int down, void *argp) {
  const char *group = argp;
  char name[96];
  snprintf(name, sizeof name, "/wavelet-%s", group);
  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0) return 1;
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = WL__LOCK_INIT, .l_len = 1};
  if (t_have_ofd() ? fcntl(fd, F_OFD_SETLK, &fl) : flock(fd, LOCK_EX | LOCK_NB)) return 2;
  wl__shm_t *h = mmap(NULL, WL__SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (h == MAP_FAILED) return 3;
  uint32_t zero = 0;
  if (!__atomic_compare_exchange_n(&h->lock_word, &zero, WL__LOCK_OWNER(WL__LOCK_JOINER, getpid()),
                                   false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
    return 4;
  t_note(up, 'L');
  for (;;) pause();
}

static void test_kill_joiner_holding_lock(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 2, 8 * MiB);
  wl_sched_t *s;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &c), 0);
  t_child_t k = t_spawn(child_joiner_holder, g);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'L');
  wl__shm_t *h = wl__test_shm(s);
  CU_ASSERT_NOT_EQUAL(WL_LD(h->lock_word), 0);
  t_kill(&k);
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 128 + SIGKILL);
  /* The dead joiner's lock is taken over (the deadline is a hang guard), and the next joiner
   * gets in. */
  CU_ASSERT_EQUAL(wl_sched_acquire(s, 8 * MiB, wl__now_ns() + 30 * SEC_NS), 0);
  CU_ASSERT_EQUAL(WL_LD(h->lock_word), 0);
  CU_ASSERT_EQUAL(wl_sched_status(s), 0);
  wl_sched_t *b;
  CU_ASSERT_EQUAL(wl_sched_join(&b, &c), 0);
  CU_ASSERT_EQUAL(t_members(s), 2);
  wl_sched_release(s, 8 * MiB);
  wl_sched_leave(b);
  wl_sched_leave(s);
  CU_ASSERT_FALSE(t_shm_exists(g));
}

/* ---- wrong layout versions and foreign segments ---------------------------------------------*/

typedef struct fake_arg_s {
  const char *group;
  size_t size;
  uint64_t magic;
  uint32_t version;
} fake_arg_t;

/* Creates a segment as another library version would and stays a "member" of it. */
static int child_fake_member(int up, int down, void *argp) {
  fake_arg_t *a = argp;
  char name[128];
  snprintf(name, sizeof name, "/wavelet-%s", a->group);
  int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)a->size)) return 1;
  if (pwrite(fd, &a->magic, 8, 0) != 8 || pwrite(fd, &a->version, 4, 8) != 4) return 2;
  /* Alive as a member is by its slot's lock; without OFD locks nothing shows it (nor is
   * needed: a segment of another layout is then always taken as in use). */
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 1, .l_len = 1};
  if (t_have_ofd() && fcntl(fd, F_OFD_SETLK, &fl)) return 3;
  t_note(up, 'f');
  t_read(down, 60000);
  return 0;
}

static void one_foreign(size_t size, uint64_t magic, uint32_t version, int expect) {
  char g[64];
  t_group(g, sizeof g);
  fake_arg_t arg = {g, size, magic, version};
  t_child_t k = t_spawn(child_fake_member, &arg);
  CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'f');
  wl_sched_config_t c = t_config(g, 2, 0);
  wl_sched_t *s = NULL;
  CU_ASSERT_EQUAL(wl_sched_join(&s, &c), expect);
  CU_ASSERT_PTR_NULL(s);
  CU_ASSERT_TRUE(t_shm_exists(g)); /* refused, not removed */
  /* Once its member is gone, the abandoned segment is replaced; without OFD locks it is still
   * taken as in use, until it is removed by hand. */
  t_note(k.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 0);
  if (!t_have_ofd()) {
    CU_ASSERT_EQUAL(wl_sched_join(&s, &c), expect);
    CU_ASSERT_TRUE(t_shm_exists(g));
    CU_ASSERT_EQUAL(wl_sched_group_remove(g), 0);
  }
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &c), 0);
  CU_ASSERT_EQUAL(wl_sched_status(s), 0);
  CU_ASSERT_EQUAL(wl_gate_enter(s), WL_GATE_HELD);
  wl_sched_leave(s);
  CU_ASSERT_FALSE(t_shm_exists(g));
}

static void test_wrong_version(void) {
  one_foreign(WL__SEG_SIZE, WL__MAGIC, WL__LAYOUT_VERSION + 1, -EPROTO);
  one_foreign(8192, WL__MAGIC, WL__LAYOUT_VERSION + 7, -EPROTO);
  one_foreign(WL__SEG_SIZE, 0x1122334455667788ull, WL__LAYOUT_VERSION, -EBADMSG);
  one_foreign(100, 0, 0, -EBADMSG);
}

/* ---- corruption ------------------------------------------------------------------------------*/

enum {
  C_TOKEN,
  C_CURSOR,
  C_ROLE,
  C_STATE,
  C_MAGIC,
  C_VERSION,
  C_WAVES,
  C_LOCK_WORD,
  C_OWN_PID,
  C_WAIT_COUNT,
  C_COUNT
};

typedef struct corrupt_arg_s {
  const char *group;
} corrupt_arg_t;

/* Joins, waits for 'g', then uses every call on the (now corrupted) group. Exit 0: it noticed,
 * left the group and ran ungated without crashing; other codes say what went wrong. */
static int child_victim(int up, int down, void *argp) {
  corrupt_arg_t *a = argp;
  wl_sched_config_t c = t_config(a->group, 4, 64 * MiB);
  wl_sched_t *s;
  if (wl_sched_join(&s, &c)) return 1;
  t_note(up, 'j');
  t_note(up, (char)wl_sched_slot(s));
  if (t_read(down, 20000) != 'g') return 2;
  int g = wl_gate_enter(s);
  int acq = wl_sched_acquire(s, MiB, wl__now_ns() + 200 * MS_NS);
  wl_sched_release(s, MiB);
  wl_gate_release(s);
  wl_sched_publish(s, WL_PHASE_FORWARD, 123);
  wl_sched_member_t m[4];
  wl_sched_members(s, m, 4);
  int st = wl_sched_status(s);
  int g2 = wl_gate_enter(s);
  int acq2 = wl_sched_acquire(s, (size_t)1 << 40, wl__now_ns() + 200 * MS_NS);
  wl_sched_leave(s);
  if (st != -EBADMSG) return 3;
  if (g2 != WL_GATE_OPEN || acq2 != 0) return 4;
  (void)g;
  (void)acq;
  return 0;
}

static void corrupt(wl__shm_t *h, int kind, unsigned victim_slot) {
  switch (kind) {
  case C_TOKEN:
    WL_ST(h->token, 200);
    break;
  case C_CURSOR:
    WL_ST(h->cursor_role, 99);
    break;
  case C_ROLE:
    WL_ST(h->slots[victim_slot].role, 77);
    break;
  case C_STATE:
    WL_ST(h->slots[victim_slot ? 0 : 1].state, 9);
    break;
  case C_MAGIC:
    WL_ST(h->magic, 0);
    break;
  case C_VERSION:
    WL_ST(h->layout_version, 7);
    break;
  case C_WAVES:
    WL_ST(h->waves, 1000);
    break;
  case C_LOCK_WORD:
    WL_ST(h->lock_word, 100u | (12345u << 7)); /* a holder no member can be */
    break;
  case C_OWN_PID:
    WL_ST(h->slots[victim_slot].pid, 1);
    break;
  case C_WAIT_COUNT:
    WL_ST(h->slots[victim_slot].wait_count, 3);
    break;
  }
}

static void test_corrupt_fields(void) {
  for (int kind = 0; kind < C_COUNT; kind++) {
    char g[64];
    t_group(g, sizeof g);
    wl_sched_config_t c = t_config(g, 4, 64 * MiB);
    wl_sched_t *a;
    CU_ASSERT_EQUAL_FATAL(wl_sched_join(&a, &c), 0);
    corrupt_arg_t arg = {g};
    t_child_t k = t_spawn(child_victim, &arg);
    CU_ASSERT_EQUAL_FATAL(t_read(k.up, 10000), 'j');
    int vs = t_read(k.up, 10000);
    CU_ASSERT_TRUE_FATAL(vs >= 0 && vs < WL__SLOTS);
    wl__shm_t *h = wl__test_shm(a);
    corrupt(h, kind, (unsigned)vs);
    t_note(k.down, 'g');
    int rc = t_wait(&k, 20000);
    if (rc != 0) fprintf(stderr, "corruption %d: victim exit %d\n", kind, rc);
    CU_ASSERT_EQUAL(rc, 0);
    /* The creator notices as well on its next call, and never crashes. */
    wl_gate_enter(a);
    CU_ASSERT_NOT_EQUAL(wl_sched_status(a), -ENOTCONN);
    wl_sched_leave(a);
    wl_sched_group_remove(g);
  }
}

static void test_corrupt_totals_repaired(void) {
  /* Derived totals are recomputed from the slots: not a reason to leave. */
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 2, 64 * MiB);
  wl_sched_t *a;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&a, &c), 0);
  CU_ASSERT_EQUAL(wl_sched_acquire(a, 4 * MiB, 0), 0);
  wl__shm_t *h = wl__test_shm(a);
  WL_ST(h->used, 999);
  WL_ST(h->members, 17);
  CU_ASSERT_EQUAL(wl_sched_acquire(a, 4 * MiB, 0), 0);
  CU_ASSERT_EQUAL(wl_sched_status(a), 0);
  CU_ASSERT_EQUAL(WL_LD(h->used), 8 * MiB);
  CU_ASSERT_EQUAL(WL_LD(h->members), 1);
  wl_sched_release(a, 8 * MiB);
  wl_sched_leave(a);
  CU_ASSERT_FALSE(t_shm_exists(g));
}

typedef struct fuzz_arg_s {
  const char *group;
  unsigned seed;
  int mutex_too;
} fuzz_arg_t;

/* Joins, overwrites random bytes of the segment, then calls everything. Reaching the end is
 * the test: a crash shows as a signal in the exit status. Exit 1 when it left the group. */
static int child_fuzz(int up, int down, void *argp) {
  fuzz_arg_t *a = argp;
  wl_sched_config_t c = t_config(a->group, 4, 64 * MiB);
  c.gate_timeout_ms = 100;
  wl_sched_t *s;
  if (wl_sched_join(&s, &c)) return 2;
  wl_sched_acquire(s, MiB, 0);
  wl_gate_enter(s);
  unsigned seed = a->seed;
  uint8_t *base = (uint8_t *)wl__test_shm(s);
  size_t lock_at = offsetof(wl__shm_t, lock_word), lock_end = lock_at + sizeof(uint32_t);
  int nbytes = 1 + (int)(rand_r(&seed) % 24);
  for (int i = 0; i < nbytes; i++) {
    size_t off;
    /* Mostly where the values live: the header and the first slots. */
    if (rand_r(&seed) % 4)
      off = (size_t)rand_r(&seed) % (offsetof(wl__shm_t, slots) + 4 * sizeof(wl__slot_t));
    else
      off = (size_t)rand_r(&seed) % sizeof(wl__shm_t);
    if (!a->mutex_too && off >= lock_at && off < lock_end) continue;
    base[off] = (uint8_t)rand_r(&seed);
  }
  wl_gate_release(s);
  wl_gate_enter(s);
  wl_sched_acquire(s, MiB, wl__now_ns() + 100 * MS_NS);
  wl_sched_release(s, 2 * MiB);
  wl_sched_publish(s, WL_PHASE_BACKWARD, 1);
  wl_sched_member_t m[8];
  wl_sched_members(s, m, 8);
  wl_sched_set_role(s, 3);
  wl_sched_stats_t st;
  wl_sched_stats_get(s, &st);
  wl_gate_release(s);
  int status = wl_sched_status(s);
  wl_sched_leave(s);
  wl_sched_group_remove(a->group);
  return status ? 1 : 0;
}

static void test_corrupt_fuzz(void) {
  int runs = 120, crashed = 0, left = 0;
  for (int i = 0; i < runs; i++) {
    char g[64];
    t_group(g, sizeof g);
    fuzz_arg_t arg = {g, 1000u + (unsigned)i, 0};
    t_child_t k = t_spawn(child_fuzz, &arg);
    int rc = t_wait(&k, 20000);
    if (rc != 0 && rc != 1) {
      fprintf(stderr, "fuzz seed %u: exit %d\n", arg.seed, rc);
      crashed++;
    }
    left += rc == 1;
    wl_sched_group_remove(g);
  }
  printf("\n    fuzz: %d runs, %d left the group, %d crashed or hung\n", runs, left, crashed);
  CU_ASSERT_EQUAL(crashed, 0);
  CU_ASSERT_TRUE(left > 0); /* the corruption was noticed at least sometimes */
}

static void test_corrupt_mutex_word(void) {
  /* A lock word naming a holder that cannot exist: the member leaves the group at once. */
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 2, 64 * MiB);
  wl_sched_t *a;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&a, &c), 0);
  wl__shm_t *h = wl__test_shm(a);
  __atomic_store_n(&h->lock_word, 0x3ffffff0, __ATOMIC_RELAXED);
  uint64_t t0 = wl__now_ns();
  CU_ASSERT_EQUAL(wl_sched_acquire(a, MiB, 0), 0); /* admitted ungated */
  CU_ASSERT_EQUAL(wl_sched_status(a), -EBADMSG);
  CU_ASSERT_EQUAL(wl_gate_enter(a), WL_GATE_OPEN);
  CU_ASSERT_TRUE(wl__now_ns() - t0 < 30 * SEC_NS); /* a hang guard: never waited for the holder */
  wl_sched_leave(a);
  wl_sched_group_remove(g);
}

/* ---- a segment truncated under live members --------------------------------------------------*/

/* Cycles gate and ledger until it notices the truncation. Exit 0: it left the group with an
 * error and kept running ungated; 3: never noticed; a signal shows as 128 + signal. */
typedef struct trunc_arg_s {
  const char *group;
  bool fault; /* pages were cut off: the SIGBUS path must be what noticed */
} trunc_arg_t;

static int child_truncee(int up, int down, void *argp) {
  trunc_arg_t *ta = argp;
  wl_sched_config_t c = t_config(ta->group, 3, 2 * MiB);
  c.gate_timeout_ms = 200;
  wl_sched_t *s;
  if (wl_sched_join(&s, &c)) return 1;
  t_note(up, 'j');
  uint64_t end = wl__now_ns() + 10 * SEC_NS;
  while (wl__now_ns() < end) {
    wl_gate_enter(s);
    int a = wl_sched_acquire(s, MiB, wl__now_ns() + 20 * MS_NS);
    wl_sched_publish(s, WL_PHASE_FORWARD, MiB);
    if (a == 0) wl_sched_release(s, MiB);
    wl_gate_release(s);
    if (wl_sched_status(s) == -EBADMSG) {
      /* Ungated and unaccounted from now on, never blocking. */
      int g = wl_gate_enter(s);
      int acq = wl_sched_acquire(s, (size_t)1 << 40, wl__now_ns() + SEC_NS);
      wl_sched_member_t m[4];
      int n = wl_sched_members(s, m, 4);
      bool lost = __atomic_load_n(&s->seg_lost, __ATOMIC_ACQUIRE);
      wl_sched_leave(s);
      if (ta->fault && !lost) return 5;
      return g == WL_GATE_OPEN && acq == 0 && n == -EBADMSG ? 0 : 4;
    }
  }
  wl_sched_leave(s);
  return 3;
}

static void one_truncation(off_t size, bool regrow) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 3, 2 * MiB);
  c.gate_timeout_ms = 200;
  wl_sched_t *me;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&me, &c), 0);
  t_child_t k[2];
  trunc_arg_t ta = {g, !regrow};
  for (int i = 0; i < 2; i++) {
    k[i] = t_spawn(child_truncee, &ta);
    CU_ASSERT_EQUAL_FATAL(t_read(k[i].up, 10000), 'j');
  }
  t_sleep_ms(150); /* they are cycling: holding, waiting on the token and on the ledger */
  char name[96];
  snprintf(name, sizeof name, "/wavelet-%s", g);
  int fd = shm_open(name, O_RDWR, 0);
  CU_ASSERT_TRUE_FATAL(fd >= 0);
  CU_ASSERT_EQUAL(ftruncate(fd, size), 0);
  if (regrow) CU_ASSERT_EQUAL(ftruncate(fd, (off_t)WL__SEG_SIZE), 0);
  close(fd);
  for (int i = 0; i < 2; i++) {
    int rc = t_wait(&k[i], 20000);
    if (rc)
      fprintf(stderr, "truncation to %ld%s: member exit %d\n", (long)size,
              regrow ? " and back" : "", rc);
    CU_ASSERT_EQUAL(rc, 0);
  }
  /* This process is a member too: it leaves without crashing and goes on ungated. */
  CU_ASSERT_EQUAL(wl_gate_enter(me), WL_GATE_OPEN);
  CU_ASSERT_EQUAL(wl_sched_status(me), -EBADMSG);
  CU_ASSERT_EQUAL(wl_sched_acquire(me, 64 * MiB, 0), 0);
  CU_ASSERT_EQUAL(__atomic_load_n(&me->seg_lost, __ATOMIC_ACQUIRE), !regrow);
  wl_sched_leave(me);
  wl_sched_group_remove(g);
}

static void test_truncated_segment(void) {
  one_truncation(0, false);
  one_truncation(4096, false); /* the header stays, the slots go */
  one_truncation((off_t)(WL__SEG_SIZE / 2), false);
  one_truncation(0, true); /* gone and back as zeros: no SIGBUS */
}

/* Faults outside the segment still reach the program's own SIGBUS handler, or kill the process
 * as they would without us. */
static void own_bus_handler(int sig) {
  _exit(42);
}

static int child_foreign_fault(int up, int down, void *argp) {
  const char *group = ((trunc_arg_t *)argp)->group;
  if (((trunc_arg_t *)argp)->fault) {
    struct sigaction sa = {.sa_handler = own_bus_handler};
    sigaction(SIGBUS, &sa, NULL);
  } else {
    signal(SIGBUS, SIG_DFL);
  }
  wl_sched_config_t c = t_config(group, 3, 0);
  wl_sched_t *s;
  if (wl_sched_join(&s, &c)) return 1;
  int fd = memfd_create("wltest-bus", 0);
  if (fd < 0 || ftruncate(fd, 8192)) return 2;
  volatile char *m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return 3;
  if (ftruncate(fd, 0)) return 4;
  m[4096] = 1; /* SIGBUS, not in a group segment */
  return 5;
}

static void test_sigbus_elsewhere(void) {
  char g[64];
  t_group(g, sizeof g);
  trunc_arg_t with = {g, true}, without = {g, false};
  t_child_t k = t_spawn(child_foreign_fault, &with);
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 42);
  k = t_spawn(child_foreign_fault, &without);
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 128 + SIGBUS);
  wl_sched_group_remove(g);
}

/* ---- permissions -----------------------------------------------------------------------------*/

#define NOBODY 65534

static int child_as_nobody(int up, int down, void *argp) {
  member_arg_t *a = argp;
  if (setgid(NOBODY) || setuid(NOBODY)) return 90;
  wl_sched_config_t c = t_config(a->group, 2, 64 * MiB);
  c.flags = a->flags;
  wl_sched_t *s;
  int rc = wl_sched_join(&s, &c);
  t_note(up, (char)(rc < 0 ? -rc : rc));
  if (rc) return 0;
  if (wl_sched_acquire(s, MiB, 0)) return 91;
  wl_sched_release(s, MiB);
  t_read(down, 20000);
  wl_sched_leave(s);
  return 0;
}

static void test_permissions(void) {
  if (geteuid() != 0) {
    printf("\n    skipped: needs root to act as another user\n");
    return;
  }
  char g[64], path[128];
  struct stat st;
  /* Owner-only: another user cannot join. */
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 2, 64 * MiB);
  wl_sched_t *s;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &c), 0);
  snprintf(path, sizeof path, "/dev/shm/wavelet-%s", g);
  CU_ASSERT_EQUAL(stat(path, &st), 0);
  CU_ASSERT_EQUAL(st.st_mode & 0777, 0600);
  member_arg_t arg = {g, -1, 2, 0, 0, NULL};
  t_child_t k = t_spawn(child_as_nobody, &arg);
  CU_ASSERT_EQUAL(t_read(k.up, 10000), EACCES);
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 0);
  CU_ASSERT_EQUAL(t_members(s), 1);
  wl_sched_leave(s);

  /* Created shared: another user may join. */
  t_group(g, sizeof g);
  c = t_config(g, 2, 64 * MiB);
  c.flags = WL_SCHED_SHARED;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &c), 0);
  snprintf(path, sizeof path, "/dev/shm/wavelet-%s", g);
  CU_ASSERT_EQUAL(stat(path, &st), 0);
  CU_ASSERT_EQUAL(st.st_mode & 0777, 0666);
  arg.group = g;
  k = t_spawn(child_as_nobody, &arg);
  CU_ASSERT_EQUAL(t_read(k.up, 10000), 0);
  CU_ASSERT_EQUAL(t_members(s), 2);
  t_note(k.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 0);
  wl_sched_leave(s);
  CU_ASSERT_FALSE(t_shm_exists(g));

  /* Another user's group, not shared: even root does not join it. (Only where another user can
   * create one: gVisor's /dev/shm under `runsc do` is not world-writable.) */
  if (stat("/dev/shm", &st) != 0 || !(st.st_mode & S_IWOTH)) {
    printf("\n    /dev/shm is not writable by other users: another user's group not tried");
    return;
  }
  t_group(g, sizeof g);
  arg.group = g;
  k = t_spawn(child_as_nobody, &arg);
  CU_ASSERT_EQUAL(t_read(k.up, 10000), 0);
  c = t_config(g, 2, 64 * MiB);
  CU_ASSERT_EQUAL(wl_sched_join(&s, &c), -EACCES);
  t_note(k.down, 'q');
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 0);
  CU_ASSERT_FALSE(t_shm_exists(g));
}

/* ---- fork --------------------------------------------------------------------------------*/

static int child_forker(int up, int down, void *argp) {
  member_arg_t *a = argp;
  wl_sched_config_t c = t_config(a->group, 2, 64 * MiB);
  wl_sched_t *s;
  if (wl_sched_join(&s, &c)) return 1;
  if (wl_sched_acquire(s, 2 * MiB, 0)) return 2;
  pid_t gc = fork();
  if (gc == 0) {
    /* The grandchild outlives its parent; it must not keep the parent "alive". */
    for (int i = 0; i < 200; i++) t_sleep_ms(100);
    _exit(0);
  }
  ssize_t n = write(up, &gc, sizeof gc);
  (void)n;
  for (;;) pause();
}

static void test_fork(void) {
  char g[64];
  t_group(g, sizeof g);
  wl_sched_config_t c = t_config(g, 2, 64 * MiB);
  wl_sched_t *s;
  CU_ASSERT_EQUAL_FATAL(wl_sched_join(&s, &c), 0);
  CU_ASSERT_EQUAL(wl_gate_enter(s), WL_GATE_HELD);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    /* A forked child never acts for its parent's member. */
    int bad = 0;
    bad |= wl_sched_status(s) != -ECHILD;
    bad |= (wl_gate_enter(s) != WL_GATE_OPEN) << 1;
    bad |= (wl_sched_acquire(s, (size_t)1 << 40, 0) != 0) << 2;
    bad |= (wl_gate_release(s) != -ECHILD) << 3;
    wl_sched_leave(s);
    _exit(bad);
  }
  int st;
  waitpid(p, &st, 0);
  CU_ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  CU_ASSERT_EQUAL(wl_sched_status(s), 0);
  CU_ASSERT_EQUAL(t_members(s), 1);
  CU_ASSERT_EQUAL(WL_LD(wl__test_shm(s)->used), 0);
  CU_ASSERT_EQUAL(wl_gate_held(s), 1);
  wl_gate_release(s);

  /* A member that forked and then died is reclaimed although its child lives on. */
  member_arg_t arg = {g, -1, 2, 0, 0, NULL};
  t_child_t k = t_spawn(child_forker, &arg);
  pid_t gc = -1;
  struct pollfd pf = {.fd = k.up, .events = POLLIN};
  CU_ASSERT_EQUAL_FATAL(poll(&pf, 1, 10000), 1);
  CU_ASSERT_EQUAL_FATAL(read(k.up, &gc, sizeof gc), (ssize_t)sizeof gc);
  CU_ASSERT_EQUAL(t_members(s), 2);
  t_kill(&k);
  CU_ASSERT_EQUAL(t_wait(&k, 10000), 128 + SIGKILL);
  CU_ASSERT_TRUE(T_UNTIL(1000, t_members(s) == 1));
  CU_ASSERT_EQUAL(kill(gc, 0), 0); /* the grandchild is alive */
  CU_ASSERT_EQUAL(WL_LD(wl__test_shm(s)->used), 0);
  kill(gc, SIGKILL);
  wl_sched_leave(s);
  CU_ASSERT_FALSE(t_shm_exists(g));
}

int main(int argc, char **argv) {
  static const wl_test_case_t cases[] = {
      {"names", test_names},
      {"options", test_options},
      {"peek", test_peek},
      {"join_leave", test_join_leave},
      {"roles", test_roles},
      {"settings_adopted", test_settings_adopted},
      {"one_gpu_per_group", test_one_gpu_per_group},
      {"gpu_alt", test_gpu_alt},
      {"prune", test_prune},
      {"inspect", test_inspect},
      {"join_leave_race", test_join_leave_race},
      {"join_leave_race_killed", test_join_leave_race_killed},
      {"lock_held_by_leaver", test_lock_held_by_leaver},
      {"member_hidden_in_proc", test_member_hidden_in_proc},
      {"kill_holding_lock", test_kill_holding_lock},
      {"kill_joiner_holding_lock", test_kill_joiner_holding_lock},
      {"wrong_version", test_wrong_version},
      {"corrupt_fields", test_corrupt_fields},
      {"corrupt_totals_repaired", test_corrupt_totals_repaired},
      {"corrupt_fuzz", test_corrupt_fuzz},
      {"corrupt_mutex_word", test_corrupt_mutex_word},
      {"truncated_segment", test_truncated_segment},
      {"sigbus_elsewhere", test_sigbus_elsewhere},
      {"permissions", test_permissions},
      {"fork", test_fork},
      {NULL, NULL},
  };
  int rc = wl_test_main(argc, argv, "sched_group", cases);
  int left = t_cleanup_shm();
  if (left) fprintf(stderr, "test_sched_group: removed %d leftover segments\n", left);
  return rc || left;
}
