/* wavelet-trace's file outputs: the SVG plot, the Perfetto (Chrome trace JSON) file and the CSV,
 * each drawn from the analysis's bins, so their size is bounded whatever the trace's length. */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void wlt_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p < 0x20 || *p >= 0x7f)
      fprintf(f, "\\u%04x", *p);
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

void wlt_json_num(FILE *f, double v, int prec) {
  if (isfinite(v))
    fprintf(f, "%.*f", prec, v);
  else
    fputs("null", f);
}

static void xml_str(FILE *f, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '<':
      fputs("&lt;", f);
      break;
    case '>':
      fputs("&gt;", f);
      break;
    case '&':
      fputs("&amp;", f);
      break;
    case '"':
      fputs("&quot;", f);
      break;
    default:
      if (*p < 0x20 || *p >= 0x7f)
        fputc('?', f); /* keep the XML valid whatever bytes a name holds */
      else
        fputc(*p, f);
    }
  }
}

uint64_t wlt_budget(const wlt_report_t *r, size_t i) {
  if (i < r->k && r->p[i].s.header.mem_limit) return r->p[i].s.header.mem_limit;
  return r->capacity;
}

/* ---- resampling to columns -------------------------------------------------------------------*/

typedef struct col_s {
  uint64_t max, min, phys;
  uint8_t flags, seen;
} col_t;

/* Resamples process p's bins onto ncol columns spanning [t0, t0 + ncol * cw). */
static void columns(const wlt_proc_t *p, uint64_t t0, double cw, size_t ncol, col_t *c) {
  memset(c, 0, ncol * sizeof *c);
  for (size_t b = 0; b < p->nbins; b++) {
    uint64_t ts = p->t0 + b * p->width;
    double x0 = ((double)ts - (double)t0) / cw, x1 = ((double)(ts + p->width) - (double)t0) / cw;
    if (x1 <= 0) continue;
    if (!(x0 < (double)ncol)) break;
    if (x1 > (double)ncol) x1 = (double)ncol;
    size_t c0 = x0 < 0 ? 0 : (size_t)x0, c1 = (size_t)x1;
    if (c1 > c0 && (double)c1 == x1) c1--; /* a bin ending on a column edge stays left of it */
    if (c1 >= ncol) c1 = ncol - 1;
    const wl_trace_bin_t *bin = &p->bins[b];
    for (size_t i = c0; i <= c1; i++) {
      col_t *q = &c[i];
      if (!q->seen || bin->live_max > q->max) q->max = bin->live_max;
      if (!q->seen || bin->live_min < q->min) q->min = bin->live_min;
      if (bin->phys_max > q->phys) q->phys = bin->phys_max;
      q->flags |= p->flags[b];
      q->seen = 1;
    }
  }
}

/* ---- SVG
 * ---------------------------------------------------------------------------------------*/

#define SVG_W    1100
#define PANEL_H  260
#define M_LEFT   90
#define M_RIGHT  30
#define M_TOP    46
#define M_BOTTOM 44
#define PLOT_W   (SVG_W - M_LEFT - M_RIGHT)

/* A tick step of 1, 2 or 5 times a power of ten, giving at most about n ticks up to max. */
static double nice_step(double max, int n) {
  if (max <= 0) return 1;
  double raw = max / n, p = pow(10, floor(log10(raw))), f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

static void bytes_unit(double max, double *div, const char **name) {
  if (max >= (double)(1ull << 30)) {
    *div = (double)(1ull << 30);
    *name = "GiB";
  } else if (max >= (double)(1ull << 20)) {
    *div = (double)(1ull << 20);
    *name = "MiB";
  } else if (max >= 1024) {
    *div = 1024;
    *name = "KiB";
  } else {
    *div = 1;
    *name = "B";
  }
}

static void time_unit(double span_ns, double *div, const char **name) {
  if (span_ns >= 10e9) {
    *div = 1e9;
    *name = "s";
  } else {
    *div = 1e6;
    *name = "ms";
  }
}

typedef struct panel_s {
  const char *id; /* suffix of element ids: "0", "1", "combined" */
  const char *title;
  col_t *c;
  size_t ncol;
  uint64_t budget;
  const char *budget_name;
  int phys; /* physical series present */
} panel_t;

static void svg_panel(FILE *f, const panel_t *pn, int y0, double span_ns) {
  double ymax = 0;
  for (size_t i = 0; i < pn->ncol; i++) {
    if ((double)pn->c[i].max > ymax) ymax = (double)pn->c[i].max;
    if (pn->phys && (double)pn->c[i].phys > ymax) ymax = (double)pn->c[i].phys;
  }
  if ((double)pn->budget > ymax) ymax = (double)pn->budget;
  if (ymax <= 0) ymax = 1;
  double udiv;
  const char *uname;
  bytes_unit(ymax, &udiv, &uname);
  double step = nice_step(ymax / udiv * 1.05, 5), top = ceil(ymax / udiv * 1.05 / step) * step;
  const int ph = PANEL_H - M_TOP - M_BOTTOM, py = y0 + M_TOP;
#define YPIX(v) (py + ph - (double)(v) / udiv / top * ph)
  fprintf(f, "<g id=\"panel-%s\">\n<text class=\"title\" x=\"%d\" y=\"%d\">", pn->id, M_LEFT,
          y0 + 24);
  xml_str(f, pn->title);
  fprintf(f, "</text>\n");
  /* forward and backward shading, as runs of columns */
  static const struct {
    uint8_t bit;
    const char *cls;
  } shade[] = {{WL_TRACE_BIN_FORWARD, "forward"}, {WL_TRACE_BIN_BACKWARD, "backward"}};
  for (int s = 0; s < 2; s++) {
    size_t i = 0;
    while (i < pn->ncol) {
      if (!(pn->c[i].flags & shade[s].bit)) {
        i++;
        continue;
      }
      size_t j = i;
      while (j < pn->ncol && (pn->c[j].flags & shade[s].bit)) j++;
      fprintf(f, "<rect class=\"%s\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\"/>\n",
              shade[s].cls, M_LEFT + (double)i * PLOT_W / pn->ncol, py,
              (double)(j - i) * PLOT_W / pn->ncol, ph);
      i = j;
    }
  }
  /* axes and ticks */
  fprintf(f, "<g class=\"axis\">\n<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", M_LEFT, py,
          M_LEFT, py + ph);
  fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", M_LEFT, py + ph, M_LEFT + PLOT_W,
          py + ph);
  for (double v = 0; v <= top + step / 2; v += step) {
    double y = py + ph - v / top * ph;
    fprintf(f, "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", M_LEFT, y,
            M_LEFT + PLOT_W, y);
    fprintf(f, "<text class=\"ylabel\" x=\"%d\" y=\"%.1f\">%g %s</text>\n", M_LEFT - 6, y + 4, v,
            uname);
  }
  double tdiv;
  const char *tname;
  time_unit(span_ns, &tdiv, &tname);
  double tstep = nice_step(span_ns / tdiv, 8);
  for (double v = 0; v <= span_ns / tdiv + 1e-9; v += tstep) {
    double x = M_LEFT + v * tdiv / span_ns * PLOT_W;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", x, py + ph, x, py + ph + 4);
    fprintf(f, "<text class=\"xlabel\" x=\"%.1f\" y=\"%d\">%g %s</text>\n", x, py + ph + 18, v,
            tname);
  }
  fprintf(f, "<text class=\"xtitle\" x=\"%d\" y=\"%d\">time since the first event (%s)</text>\n",
          M_LEFT + PLOT_W / 2, py + ph + 36, tname);
  fprintf(f,
          "<text class=\"ytitle\" transform=\"translate(%d,%d) rotate(-90)\">memory (%s)</text>\n",
          20, py + ph / 2, uname);
  fprintf(f, "</g>\n");
  /* the series */
  if (pn->phys) {
    fprintf(f, "<polyline id=\"physical-%s\" class=\"physical\" points=\"", pn->id);
    for (size_t i = 0; i < pn->ncol; i++)
      if (pn->c[i].seen)
        fprintf(f, "%.1f,%.1f ", M_LEFT + (i + 0.5) * PLOT_W / pn->ncol, YPIX(pn->c[i].phys));
    fprintf(f, "\"/>\n");
  }
  fprintf(f, "<polyline id=\"live-%s\" class=\"live\" points=\"", pn->id);
  for (size_t i = 0; i < pn->ncol; i++) {
    if (!pn->c[i].seen) continue;
    double x = M_LEFT + (i + 0.5) * PLOT_W / pn->ncol;
    fprintf(f, "%.1f,%.1f ", x, YPIX(pn->c[i].max));
    if (pn->c[i].min != pn->c[i].max) fprintf(f, "%.1f,%.1f ", x, YPIX(pn->c[i].min));
  }
  fprintf(f, "\"/>\n");
  if (pn->budget) {
    double y = YPIX(pn->budget);
    fprintf(
        f,
        "<line id=\"budget-%s\" class=\"budget\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n",
        pn->id, M_LEFT, y, M_LEFT + PLOT_W, y);
    fprintf(f, "<text class=\"budgetlabel\" x=\"%d\" y=\"%.1f\">%s %g %s</text>\n",
            M_LEFT + PLOT_W - 4, y - 4, pn->budget_name, (double)pn->budget / udiv, uname);
  }
  /* legend */
  int lx = M_LEFT + PLOT_W - 430, ly = y0 + 14;
  fprintf(f, "<g class=\"legend\">\n");
  fprintf(f,
          "<line class=\"live\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/><text x=\"%d\" "
          "y=\"%d\">live</text>\n",
          lx, ly + 6, lx + 20, ly + 6, lx + 24, ly + 10);
  if (pn->phys)
    fprintf(f,
            "<line class=\"physical\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/><text x=\"%d\" "
            "y=\"%d\">physical</text>\n",
            lx + 60, ly + 6, lx + 80, ly + 6, lx + 84, ly + 10);
  fprintf(f,
          "<rect class=\"forward\" x=\"%d\" y=\"%d\" width=\"14\" height=\"10\"/><text x=\"%d\" "
          "y=\"%d\">forward</text>\n",
          lx + 150, ly + 1, lx + 168, ly + 10);
  fprintf(f,
          "<rect class=\"backward\" x=\"%d\" y=\"%d\" width=\"14\" height=\"10\"/><text x=\"%d\" "
          "y=\"%d\">backward</text>\n",
          lx + 230, ly + 1, lx + 248, ly + 10);
  if (pn->budget)
    fprintf(f,
            "<line class=\"budget\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/><text x=\"%d\" "
            "y=\"%d\">%s</text>\n",
            lx + 320, ly + 6, lx + 340, ly + 6, lx + 344, ly + 10, pn->budget_name);
  fprintf(f, "</g>\n</g>\n");
#undef YPIX
}

int wlt_write_svg(const wlt_report_t *r, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return -errno;
  size_t npanels = r->k + (r->comb ? 1 : 0), ncol = PLOT_W;
  double span = (double)(r->tmax > r->tmin ? r->tmax - r->tmin : 1);
  double cw = span / (double)ncol;
  col_t *c = malloc(ncol * sizeof *c);
  if (!c) {
    fclose(f);
    return -ENOMEM;
  }
  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%zu\" viewBox=\"0 0 %d "
          "%zu\">\n",
          SVG_W, npanels * PANEL_H, SVG_W, npanels * PANEL_H);
  fprintf(f, "<title>wavelet-trace: memory over time</title>\n<style>\n"
             "text{font-family:sans-serif;font-size:12px;fill:#222}\n"
             ".title{font-size:14px;font-weight:bold}\n"
             ".ylabel{text-anchor:end}.xlabel,.xtitle,.ytitle{text-anchor:middle}\n"
             ".budgetlabel{text-anchor:end;fill:#c0392b}\n"
             ".axis line{stroke:#444;stroke-width:1}.axis .grid{stroke:#ddd}\n"
             ".live{fill:none;stroke:#1f5fbf;stroke-width:1.2}\n"
             ".physical{fill:none;stroke:#7f7f7f;stroke-width:1.2;stroke-dasharray:4 3}\n"
             ".budget{stroke:#c0392b;stroke-width:1.5;stroke-dasharray:8 4}\n"
             ".forward{fill:#f5b041;fill-opacity:0.25}.backward{fill:#58d68d;fill-opacity:0.25}\n"
             "</style>\n");
  fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%zu\" fill=\"white\"/>\n", SVG_W,
          npanels * PANEL_H);
  for (size_t i = 0; i < r->k; i++) {
    const wlt_proc_t *p = &r->p[i];
    columns(p, r->tmin, cw, ncol, c);
    char id[24], title[400];
    snprintf(id, sizeof id, "%zu", i);
    snprintf(title, sizeof title, "%s: live%s memory, forward and backward shaded (%s)", p->label,
             p->s.physical_peak_bytes ? " and physical" : "", p->path);
    panel_t pn = {id,
                  title,
                  c,
                  ncol,
                  wlt_budget(r, i),
                  p->s.header.mem_limit ? "budget" : "device memory",
                  p->s.physical_peak_bytes != 0};
    svg_panel(f, &pn, (int)(i * PANEL_H), span);
  }
  if (r->comb) {
    const wl_trace_combined_t *cb = r->comb;
    memset(c, 0, ncol * sizeof *c);
    for (size_t g = 0; g < cb->n; g++) {
      double x = ((double)(cb->t0_ns + g * cb->width_ns) - (double)r->tmin) / cw;
      if (!(x >= 0)) continue;
      size_t ci = x < (double)ncol ? (size_t)x : ncol - 1;
      if (!c[ci].seen || cb->live[g] > c[ci].max) c[ci].max = cb->live[g];
      if (!c[ci].seen || cb->live[g] < c[ci].min) c[ci].min = cb->live[g];
      if (cb->overlap[g]) c[ci].flags |= WL_TRACE_BIN_FORWARD; /* overlap shown as forward */
      c[ci].seen = 1;
    }
    uint64_t bud = r->p[0].s.header.mem_limit ? r->p[0].s.header.mem_limit : r->capacity;
    panel_t pn = {"combined", "combined live memory of all traces (shaded: rising phases overlap)",
                  c,          ncol,
                  bud,        r->p[0].s.header.mem_limit ? "budget" : "device memory",
                  0};
    svg_panel(f, &pn, (int)(r->k * PANEL_H), span);
  }
  fprintf(f, "</svg>\n");
  free(c);
  int rc = ferror(f) ? -EIO : 0;
  if (fclose(f) && !rc) rc = -errno;
  return rc;
}

/* ---- Perfetto / Chrome trace JSON ------------------------------------------------------------*/

#define PF_POINTS 8192u /* counter samples per process */
#define PF_SLICES 100000u

static void pf_counter(FILE *f, int *first, unsigned pid, const char *name, double ts_us,
                       uint64_t v) {
  fprintf(f, "%s\n{\"ph\":\"C\",\"pid\":%u,\"name\":\"%s\",\"ts\":%.3f,\"args\":{\"bytes\":%llu}}",
          *first ? "" : ",", pid, name, ts_us, (unsigned long long)v);
  *first = 0;
}

static void pf_slice(FILE *f, int *first, unsigned pid, unsigned tid, const char *name,
                     double ts_us, double dur_us, const char *args) {
  fprintf(f,
          "%s\n{\"ph\":\"X\",\"pid\":%u,\"tid\":%u,\"name\":\"%s\",\"ts\":%.3f,\"dur\":%.3f,"
          "\"args\":{%s}}",
          *first ? "" : ",", pid, tid, name, ts_us, dur_us < 0 ? 0 : dur_us, args);
  *first = 0;
}

static void pf_meta(FILE *f, int *first, unsigned pid, int tid, const char *what,
                    const char *name) {
  fprintf(f, "%s\n{\"ph\":\"M\",\"pid\":%u,", *first ? "" : ",", pid);
  if (tid >= 0) fprintf(f, "\"tid\":%d,", tid);
  fprintf(f, "\"name\":\"%s\",\"args\":{\"name\":", what);
  wlt_json_str(f, name);
  fprintf(f, "}}");
  *first = 0;
}

int wlt_write_perfetto(const wlt_report_t *r, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return -errno;
  double span = (double)(r->tmax > r->tmin ? r->tmax - r->tmin : 1);
  size_t ncol = PF_POINTS;
  double cw = span / (double)ncol;
  col_t *c = malloc(ncol * sizeof *c);
  if (!c) {
    fclose(f);
    return -ENOMEM;
  }
  int first = 1;
  fprintf(
      f,
      "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"tool\":\"wavelet-trace\"},\"traceEvents\":[");
  for (size_t i = 0; i < r->k; i++) {
    const wlt_proc_t *p = &r->p[i];
    /* Distinct pids even when traces share one (or carry none). */
    unsigned pid = p->s.header.pid ? p->s.header.pid : (unsigned)(i + 1);
    for (size_t j = 0; j < i; j++)
      if (r->p[j].s.header.pid == p->s.header.pid) pid = 1000000u + (unsigned)i;
    pf_meta(f, &first, pid, -1, "process_name", p->label);
    pf_meta(f, &first, pid, 1, "thread_name", "phases");
    pf_meta(f, &first, pid, 2, "thread_name", "waits");
    columns(p, r->tmin, cw, ncol, c);
    for (size_t j = 0; j < ncol; j++) {
      if (!c[j].seen) continue;
      double ts = (double)j * cw / 1e3;
      pf_counter(f, &first, pid, "live bytes", ts, c[j].max);
      if (p->s.physical_peak_bytes) pf_counter(f, &first, pid, "physical bytes", ts, c[j].phys);
    }
    size_t nsl = 0;
    char args[64];
    for (size_t j = 0; j < p->niters && nsl < PF_SLICES; j++, nsl += 2) {
      const wl_trace_iteration_t *it = &p->iters[j];
      double b = ((double)it->begin_ns - (double)r->tmin) / 1e3;
      double m = ((double)it->backward_ns - (double)r->tmin) / 1e3;
      double e = ((double)(it->fall_ns ? it->fall_ns : it->end_ns) - (double)r->tmin) / 1e3;
      snprintf(args, sizeof args, "\"iteration\":%zu,\"peak_bytes\":%llu", j,
               (unsigned long long)it->peak_bytes);
      if (it->backward_ns) {
        pf_slice(f, &first, pid, 1, "forward", b, m - b, args);
        pf_slice(f, &first, pid, 1, "backward", m, e - m, args);
      } else {
        pf_slice(f, &first, pid, 1, "iteration", b, e - b, args);
      }
    }
    for (size_t j = 0; j < p->nspans && j < PF_SLICES; j++) {
      const wl_trace_span_t *sp = &p->spans[j];
      double b = ((double)sp->begin_ns - (double)r->tmin) / 1e3;
      pf_slice(f, &first, pid, 2, sp->kind == WL_TRACE_GATE_GRANT ? "gate wait" : "memory wait", b,
               (double)(sp->end_ns - sp->begin_ns) / 1e3, "");
    }
  }
  if (r->comb) {
    const unsigned pid = 999999u;
    pf_meta(f, &first, pid, -1, "process_name", "combined (all traces)");
    const wl_trace_combined_t *cb = r->comb;
    size_t stride = cb->n / PF_POINTS + 1;
    for (size_t g = 0; g < cb->n; g += stride) {
      uint64_t v = 0;
      for (size_t h = g; h < g + stride && h < cb->n; h++)
        if (cb->live[h] > v) v = cb->live[h];
      double ts = ((double)(cb->t0_ns + g * cb->width_ns) - (double)r->tmin) / 1e3;
      if (ts < 0) ts = 0;
      pf_counter(f, &first, pid, "combined live bytes", ts, v);
    }
  }
  fprintf(f, "\n]}\n");
  free(c);
  int rc = ferror(f) ? -EIO : 0;
  if (fclose(f) && !rc) rc = -errno;
  return rc;
}

/* ---- CSV
 * ---------------------------------------------------------------------------------------*/

#define CSV_ROWS 65536u

int wlt_write_csv(const wlt_report_t *r, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return -errno;
  double span = (double)(r->tmax > r->tmin ? r->tmax - r->tmin : 1);
  size_t ncol = CSV_ROWS;
  double cw = span / (double)ncol;
  col_t *c = malloc(ncol * sizeof *c);
  if (!c) {
    fclose(f);
    return -ENOMEM;
  }
  fprintf(f, "time_ms,process,pid,role,live_max_bytes,live_min_bytes,physical_bytes,phase\n");
  for (size_t i = 0; i < r->k; i++) {
    const wlt_proc_t *p = &r->p[i];
    columns(p, r->tmin, cw, ncol, c);
    for (size_t j = 0; j < ncol; j++) {
      if (!c[j].seen) continue;
      const char *ph = (c[j].flags & WL_TRACE_BIN_FORWARD)    ? "forward"
                       : (c[j].flags & WL_TRACE_BIN_BACKWARD) ? "backward"
                                                              : "";
      fprintf(f, "%.6f,%zu,%u,%d,%llu,%llu,%llu,%s\n", (double)j * cw / 1e6, i, p->s.header.pid,
              p->s.header.role, (unsigned long long)c[j].max, (unsigned long long)c[j].min,
              (unsigned long long)c[j].phys, ph);
    }
  }
  if (r->comb) {
    const wl_trace_combined_t *cb = r->comb;
    size_t stride = cb->n / CSV_ROWS + 1;
    for (size_t g = 0; g < cb->n; g += stride) {
      uint64_t hi = 0, lo = UINT64_MAX;
      int ov = 0;
      for (size_t h = g; h < g + stride && h < cb->n; h++) {
        if (cb->live[h] > hi) hi = cb->live[h];
        if (cb->live[h] < lo) lo = cb->live[h];
        ov |= cb->overlap[h];
      }
      double ts = ((double)(cb->t0_ns + g * cb->width_ns) - (double)r->tmin) / 1e6;
      fprintf(f, "%.6f,combined,,,%llu,%llu,,%s\n", ts < 0 ? 0 : ts, (unsigned long long)hi,
              (unsigned long long)lo, ov ? "overlap" : "");
    }
  }
  free(c);
  int rc = ferror(f) ? -EIO : 0;
  if (fclose(f) && !rc) rc = -errno;
  return rc;
}
