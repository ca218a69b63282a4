// Just enough JSON output for --version, timings.json and numerics.json.
#pragma once

#include <string>
#include <vector>

namespace etlab {

std::string json_string(const std::string& text);
std::string json_number(double value);  // fixed, 6 decimals; non-finite becomes null
std::string json_number_exact(double value);  // 17 significant digits (reads back as the same double); non-finite: null
std::string json_number_list(const std::vector<double>& values);

}  // namespace etlab
