#include "pax/plot.h"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "parallax/core.h"

namespace px::pax {
namespace {

void set_rgb(cairo_t* cr, uint32_t rgb) {
  cairo_set_source_rgb(cr, ((rgb >> 16) & 0xff) / 255.0, ((rgb >> 8) & 0xff) / 255.0, (rgb & 0xff) / 255.0);
}

// Round tick spacing (1, 2 or 5 times a power of ten) giving about `n` ticks over [lo, hi].
double tick_step(double lo, double hi, int n) {
  double raw = (hi - lo) / n;
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  double f = raw / p;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

std::string tick_label(double v, double step) {
  char buf[32];
  if (std::fabs(v) < step * 1e-6) v = 0;
  if (std::fabs(v) >= 1e5 || (std::fabs(v) > 0 && std::fabs(v) < 1e-3))
    std::snprintf(buf, sizeof buf, "%.1e", v);
  else
    std::snprintf(buf, sizeof buf, "%.*f", step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step))), v);
  return buf;
}

void text(cairo_t* cr, double x, double y, const std::string& s, double ax, double ay) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  cairo_move_to(cr, x - ax * e.width - e.x_bearing, y - ay * e.height - e.y_bearing);
  cairo_show_text(cr, s.c_str());
}

}  // namespace

void plot_png(const std::string& path, const std::string& title, const std::string& xlabel, const std::string& ylabel,
              const std::vector<Series>& series, int width, int height) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  if (!(x0 <= x1)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // nothing to draw yet: empty axes
  if (x1 - x0 < 1e-12) x0 -= 1, x1 += 1;
  if (y1 - y0 < 1e-12) y0 -= 0.5, y1 += 0.5;
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad, y1 += pad;

  cairo_surface_t* surf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height);
  cairo_t* cr = cairo_create(surf);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);

  const double L = 80, R = width - 20, T = 40, B = height - 55;
  auto px_x = [&](double x) { return L + (x - x0) / (x1 - x0) * (R - L); };
  auto px_y = [&](double y) { return B - (y - y0) / (y1 - y0) * (B - T); };

  // Grid, ticks and their labels.
  cairo_set_font_size(cr, 12);
  cairo_set_line_width(cr, 1);
  const double xs = tick_step(x0, x1, 8), ys = tick_step(y0, y1, 6);
  for (double v = std::ceil(x0 / xs) * xs; v <= x1 + 1e-9 * xs; v += xs) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, std::round(px_x(v)) + 0.5, T);
    cairo_line_to(cr, std::round(px_x(v)) + 0.5, B);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    text(cr, px_x(v), B + 6, tick_label(v, xs), 0.5, 0);
  }
  for (double v = std::ceil(y0 / ys) * ys; v <= y1 + 1e-9 * ys; v += ys) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, L, std::round(px_y(v)) + 0.5);
    cairo_line_to(cr, R, std::round(px_y(v)) + 0.5);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    text(cr, L - 6, px_y(v), tick_label(v, ys), 1, 0.5);
  }
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_rectangle(cr, L + 0.5, T + 0.5, R - L, B - T);
  cairo_stroke(cr);

  // Labels and title.
  cairo_set_font_size(cr, 13);
  text(cr, (L + R) / 2, height - 8, xlabel, 0.5, 1);
  cairo_save(cr);
  cairo_translate(cr, 18, (T + B) / 2);
  cairo_rotate(cr, -M_PI / 2);
  text(cr, 0, 0, ylabel, 0.5, 0.5);
  cairo_restore(cr);
  cairo_set_font_size(cr, 15);
  text(cr, (L + R) / 2, 12, title, 0.5, 0);

  // Curves, clipped to the plot area.
  cairo_save(cr);
  cairo_rectangle(cr, L, T, R - L, B - T);
  cairo_clip(cr);
  cairo_set_line_width(cr, 2);
  for (const Series& s : series) {
    set_rgb(cr, s.rgb);
    bool pen = false;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i])) {
        pen = false;
        continue;
      }
      if (pen) cairo_line_to(cr, px_x(s.x[i]), px_y(s.y[i]));
      else cairo_move_to(cr, px_x(s.x[i]), px_y(s.y[i]));
      pen = true;
    }
    cairo_stroke(cr);
    if (s.markers)
      for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
        if (!std::isfinite(s.y[i])) continue;
        cairo_arc(cr, px_x(s.x[i]), px_y(s.y[i]), 4, 0, 2 * M_PI);
        cairo_fill(cr);
      }
  }
  cairo_restore(cr);

  // Legend, top right.
  cairo_set_font_size(cr, 12);
  double ly = T + 16;
  for (const Series& s : series) {
    set_rgb(cr, s.rgb);
    cairo_set_line_width(cr, 3);
    cairo_move_to(cr, R - 110, ly);
    cairo_line_to(cr, R - 85, ly);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, R - 78, ly, s.label, 0, 0.5);
    ly += 18;
  }

  cairo_destroy(cr);
  const std::string tmp = path + ".tmp";
  cairo_status_t st = cairo_surface_write_to_png(surf, tmp.c_str());
  cairo_surface_destroy(surf);
  if (st != CAIRO_STATUS_SUCCESS)
    throw Error("[pax] cannot write the plot '" + path + "': " + cairo_status_to_string(st));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("[pax] cannot write the plot '" + path + "': " + ec.message());
}

}  // namespace px::pax
