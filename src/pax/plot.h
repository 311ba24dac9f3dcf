// Line plots as PNG files (cairo): the loss and log-perplexity curves of a run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace px::pax {

struct Series {
  std::string label;
  std::vector<double> x, y;
  uint32_t rgb = 0x1f77b4;
  bool markers = false;  // dots at each point (sparse series such as eval)
};

// Writes `path` atomically (temporary file, then rename); throws px::Error naming it on failure.
void plot_png(const std::string& path, const std::string& title, const std::string& xlabel, const std::string& ylabel,
              const std::vector<Series>& series, int width = 800, int height = 500);

}  // namespace px::pax
