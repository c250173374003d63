// Counters of the engine and its SAs for people (text) and programs (JSON). Keys never appear.
#pragma once

#include <memory>
#include <vector>

#include <string>

#include <nlohmann/json.hpp>

#include "userspace/esp/engine.h"

namespace xesp {

nlohmann::json counters_json(const Counters &c, bool all_drops);
nlohmann::json engine_json(const Engine &e);

// The engine's numbers at one moment, taken on the thread that runs it (a copy of counters,
// no formatting), to be turned into JSON on any other: a report of many SAs then costs the
// data path only the copy.
struct SaSample {
    std::shared_ptr<const Sa> sa;  // its configuration, and alive while the sample is
    Counters counters;
    uint64_t oseq = 0, reserved = 0, replay_top = 0;
    bool bound = false, soft_expired = false, hard_expired = false;
    uint64_t soft_left = UINT64_MAX, hard_left = UINT64_MAX;  // seconds (Sa::seconds_left)
    uint32_t path_mtu = 0, tunnel_mtu = 0;
};
struct EngineSample {
    EngineStats totals;
    uint32_t link_mtu = 0;
    std::vector<SaSample> sas;
};
// With totals other than e.stats() (a gateway adds those of engines it replaced), and each
// SA's tunnel MTU for an egress link of link_mtu (0: 1500).
EngineSample sample_engine(const Engine &e, const EngineStats &totals, uint32_t link_mtu);
nlohmann::json engine_json(const EngineSample &s);
std::string engine_text(const Engine &e);
std::string sa_label(const SaConfig &c);  // "esp spi 0x1000 192.0.2.1 -> 192.0.2.2 tunnel"

}  // namespace xesp
