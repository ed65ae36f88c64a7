#include "sharding_text.h"

#include <nlohmann/json.hpp>

namespace shardkeep::cli {
namespace {

using nlohmann::json;

std::string AxisText(const json& entry) {
  if (entry.is_null()) return "None";
  if (entry.is_string()) return entry.get<std::string>();
  if (entry.is_array()) {
    std::string text = "(";
    for (size_t i = 0; i < entry.size(); ++i) {
      if (i > 0) text += ", ";
      text += AxisText(entry[i]);
    }
    return text + ")";
  }
  return entry.dump();
}

// The named form, or "" when `d` does not have its fields.
std::string NamedText(const json& d) {
  const auto names = d.find("axis_names");
  const auto shape = d.find("mesh_shape");
  const auto spec = d.find("spec");
  if (names == d.end() || shape == d.end() || spec == d.end() || !names->is_array() ||
      !shape->is_array() || !spec->is_array() || names->size() != shape->size()) {
    return "";
  }
  std::string text = "P(";
  for (size_t i = 0; i < spec->size(); ++i) {
    if (i > 0) text += ", ";
    text += AxisText((*spec)[i]);
  }
  text += ") mesh(";
  for (size_t i = 0; i < names->size(); ++i) {
    if (i > 0) text += ", ";
    text += AxisText((*names)[i]) + "=" + (*shape)[i].dump();
  }
  return text + ")";
}

}  // namespace

std::string ShardingText(const std::string& sharding_json) {
  const json d = json::parse(sharding_json, nullptr, /*allow_exceptions=*/false);
  if (d.is_discarded()) return sharding_json;
  if (d.is_null()) return "-";
  if (d.is_object()) {
    const auto found = d.find("type");
    const std::string type =
        found != d.end() && found->is_string() ? found->get<std::string>() : "";
    if (type == "named") {
      std::string text = NamedText(d);
      if (!text.empty()) return text;
    } else if (type == "single_device" && d.contains("device_id")) {
      return "device " + d["device_id"].dump();
    } else if (type == "other" && d.contains("class") && d["class"].is_string()) {
      return d["class"].get<std::string>();
    }
  }
  return d.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace shardkeep::cli
