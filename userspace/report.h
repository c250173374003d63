// Counters of the engine and its SAs for people (text) and programs (JSON). Keys never appear.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "userspace/engine.h"

namespace xesp {

nlohmann::json counters_json(const Counters &c, bool all_drops);
nlohmann::json engine_json(const Engine &e);
// With totals other than e.stats() (a gateway adds those of engines it replaced), and each
// SA's tunnel MTU for an egress link of link_mtu (0: 1500).
nlohmann::json engine_json(const Engine &e, const EngineStats &totals, uint32_t link_mtu);
std::string engine_text(const Engine &e);
std::string sa_label(const SaConfig &c);     // "esp spi 0x1000 192.0.2.1 -> 192.0.2.2 tunnel"

} // namespace xesp
