// machineCpus: the CPUs the ranks of one machine may use together, from their affinity masks.
// The settings every rank must read alike (the GPU planner's, the host engine's).
#include "runtime/peer_info.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "harness/harness.h"

using tutti::PeerInfo;

namespace {

PeerInfo onCpus(uint64_t machine, std::vector<int> cpus, int beyond = 0) {
  PeerInfo p{};
  p.machineHash = machine;
  for (int c : cpus) p.cpuMask[c / 64] |= uint64_t(1) << (c % 64);
  p.cpus = int32_t(cpus.size()) + beyond;  // `beyond`: CPUs from 1024 up
  return p;
}

}  // namespace

TEST(PeerInfo, MachineCpusIsTheUnionOfTheRanksMasksOnThatMachine) {
  // A core each (bound as mpirun or srun bind): two CPUs.
  std::vector<PeerInfo> bound = {onCpus(1, {0}), onCpus(1, {1})};
  EXPECT_EQ(tutti::machineCpus(bound.data(), bound.size(), 1), 2);
  // Both on one core: one.
  std::vector<PeerInfo> one = {onCpus(1, {3}), onCpus(1, {3})};
  EXPECT_EQ(tutti::machineCpus(one.data(), one.size(), 1), 1);
  // Overlapping masks, high CPU numbers, and another machine's ranks left out.
  std::vector<PeerInfo> mixed = {onCpus(7, {0, 1, 64}), onCpus(7, {1, 2, 1023}),
                                 onCpus(8, {5, 6, 7, 8})};
  EXPECT_EQ(tutti::machineCpus(mixed.data(), mixed.size(), 7), 5);
  EXPECT_EQ(tutti::machineCpus(mixed.data(), mixed.size(), 8), 4);
  // CPUs from 1024 up are known only by count: the most any one rank has.
  std::vector<PeerInfo> big = {onCpus(2, {0}, 100), onCpus(2, {1}, 40)};
  EXPECT_EQ(tutti::machineCpus(big.data(), big.size(), 2), 102);
  // A machine without ranks here still counts one CPU, never zero.
  EXPECT_EQ(tutti::machineCpus(bound.data(), bound.size(), 99), 1);
}

// The local process's own entry carries its affinity mask.
TEST(PeerInfo, LocalInfoCarriesThisProcesssAffinity) {
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  PeerInfo me = tutti::localPeerInfo(0, -1, tutti::net::SockAddr{});
  EXPECT_EQ(me.cpus, CPU_COUNT(&set));
  std::vector<PeerInfo> alone = {me};
  EXPECT_EQ(tutti::machineCpus(alone.data(), 1, me.machineHash), CPU_COUNT(&set));
}

// The GPU planner's settings come from the environment, travel in PeerInfo, and must agree on
// every GPU rank: a difference is named (which variable, which ranks, their values); CPU
// ranks are left out (they plan no kernels).
TEST(PeerInfo, GpuRanksMustAgreeOnThePlannersSettings) {
  tutti::DeviceSettings d{}, fresh{};
  {
    tutti::test::ScopedEnv proto("NCCL_PROTO", "ll");
    tutti::test::ScopedEnv gather("TUTTI_LL_GATHER_MAX_BYTES", "0");
    tutti::test::ScopedEnv ll("TUTTI_LL_MAX_BYTES", nullptr);
    tutti::test::ScopedEnv channels("NCCL_MAX_NCHANNELS", "32");
    tutti::test::ScopedEnv p2p("NCCL_P2P_DISABLE", nullptr);
    d = tutti::deviceSettingsFromEnv();
  }
  EXPECT_EQ(d.proto, 1);  // dev::kLL
  EXPECT_EQ(d.gatherMaxBytes, 0);
  EXPECT_EQ(d.llMaxBytes, 64 << 10);
  EXPECT_EQ(d.maxChannels, 16);  // as the engine clamps it
  EXPECT_EQ(d.p2pDisabled, 0);
  {
    tutti::test::ScopedEnv proto("NCCL_PROTO", nullptr);
    tutti::test::ScopedEnv gather("TUTTI_LL_GATHER_MAX_BYTES", nullptr);
    tutti::test::ScopedEnv channel("TUTTI_DEV_CHANNEL_BYTES", nullptr);
    tutti::test::ScopedEnv buff("NCCL_BUFFSIZE", nullptr);
    fresh = tutti::deviceSettingsFromEnv();
  }
  EXPECT_EQ(fresh.proto, -1);
  EXPECT_EQ(fresh.gatherMaxBytes, 4 << 10);
  {
    tutti::test::ScopedEnv buff("NCCL_BUFFSIZE", "2097152");
    EXPECT_EQ(tutti::deviceSettingsFromEnv().buffSize, 2 << 20);
  }

  std::vector<PeerInfo> peers(4);
  for (int r = 0; r < 4; ++r) {
    peers[size_t(r)].rank = r;
    peers[size_t(r)].cudaDev = 0;
    peers[size_t(r)].device = fresh;
  }
  EXPECT_TRUE(tutti::checkDeviceSettingsAgree(peers.data(), peers.size()).ok());
  peers[2].device.proto = 1;
  tutti::Status s = tutti::checkDeviceSettingsAgree(peers.data(), peers.size());
  EXPECT_EQ(s.code(), tutti::Code::kInvalidUsage);
  EXPECT_NE(s.message().find("NCCL_PROTO differs between ranks: rank 0 reads unset (automatic), "
                             "rank 2 LL"),
            std::string::npos)
      << s.message();
  peers[2].device = fresh;
  peers[3].device.channelBytes = 1 << 20;
  s = tutti::checkDeviceSettingsAgree(peers.data(), peers.size());
  EXPECT_NE(s.message().find("TUTTI_DEV_CHANNEL_BYTES differs between ranks: rank 0 reads 524288, "
                             "rank 3 1048576"),
            std::string::npos)
      << s.message();
  peers[3].device = fresh;
  peers[1].device.buffSize = 2 << 20;  // the device FIFOs' slots
  s = tutti::checkDeviceSettingsAgree(peers.data(), peers.size());
  EXPECT_NE(s.message().find("NCCL_BUFFSIZE differs between ranks: rank 0 reads 4194304, rank 1 "
                             "2097152"),
            std::string::npos)
      << s.message();
  peers[1].device = fresh;
  peers[1].device.p2pDisabled = 1;  // carried, not compared: each pair decides with both ends'
  EXPECT_TRUE(tutti::checkDeviceSettingsAgree(peers.data(), peers.size()).ok());
  peers[3].device.channelBytes = 1 << 20;
  peers[3].cudaDev = -1;  // a CPU rank: its settings do not matter
  EXPECT_TRUE(tutti::checkDeviceSettingsAgree(peers.data(), peers.size()).ok());
}

// The settings that shape host-buffer operations come from the environment as written (empty
// counts as unset), travel in PeerInfo, and must agree on every rank, GPU ranks and CPU ranks
// alike: each difference is named (which variable, two ranks, their values).
TEST(PeerInfo, EveryRankMustAgreeOnTheHostSettings) {
  auto slot = [](const char* name) {
    for (int i = 0; i < tutti::HostSettings::kCount; ++i) {
      if (std::string(tutti::kHostSettingNames[i]) == name) return i;
    }
    ADD_FAILURE() << name << " is not a host setting";
    return 0;
  };
  tutti::HostSettings fresh{}, set{};
  {
    tutti::test::ScopedEnv rd("TUTTI_RD_MAX_BYTES", nullptr);
    tutti::test::ScopedEnv buff("NCCL_BUFFSIZE", "");
    tutti::test::ScopedEnv net("NCCL_NET", nullptr);
    fresh = tutti::hostSettingsFromEnv();
  }
  {
    tutti::test::ScopedEnv rd("TUTTI_RD_MAX_BYTES", "0");
    tutti::test::ScopedEnv buff("NCCL_BUFFSIZE", "2097152");
    tutti::test::ScopedEnv net("NCCL_NET", "a-network-plugin-name");
    set = tutti::hostSettingsFromEnv();
  }
  const int rd = slot("TUTTI_RD_MAX_BYTES"), buff = slot("NCCL_BUFFSIZE"), net = slot("NCCL_NET");
  EXPECT_EQ(fresh.hash[rd], 0u);
  EXPECT_EQ(fresh.hash[buff], 0u);  // empty: unset
  EXPECT_NE(set.hash[rd], 0u);
  EXPECT_STREQ(set.shown[buff], "2097152");
  EXPECT_STREQ(set.shown[net], "a-network-pl...");  // 21 characters, cut

  std::vector<PeerInfo> peers(4);
  for (int r = 0; r < 4; ++r) {
    peers[size_t(r)].rank = r;
    peers[size_t(r)].cudaDev = r % 2 ? 0 : -1;  // GPU ranks' host buffers run on the CPU engine too
    peers[size_t(r)].host = fresh;
  }
  EXPECT_TRUE(tutti::checkHostSettingsAgree(peers.data(), peers.size()).ok());
  EXPECT_TRUE(tutti::checkHostSettingsAgree(peers.data(), 1).ok());
  peers[2].host.hash[rd] = set.hash[rd];
  memcpy(peers[2].host.shown[rd], set.shown[rd], sizeof(set.shown[rd]));
  tutti::Status s = tutti::checkHostSettingsAgree(peers.data(), peers.size());
  EXPECT_EQ(s.code(), tutti::Code::kInvalidUsage);
  EXPECT_NE(s.message().find("a setting differs between ranks (TUTTI_RD_MAX_BYTES: rank 0 reads "
                             "unset, rank 2 reads 0)"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("set them alike on every rank"), std::string::npos) << s.message();
  // Every variable that differs is named, each once; a long value is cut, and says so.
  for (PeerInfo& p : peers) p.host = set;
  peers[3].host = fresh;
  peers[1].host.hash[net] ^= 1;  // the same first 12 characters, another value
  s = tutti::checkHostSettingsAgree(peers.data(), peers.size());
  EXPECT_NE(s.message().find("3 settings differ between ranks (NCCL_BUFFSIZE: rank 0 reads "
                             "2097152, rank 3 reads unset; NCCL_NET: rank 0 reads "
                             "a-network-pl..., rank 1 reads a-network-pl...; "
                             "TUTTI_RD_MAX_BYTES: rank 0 reads 0, rank 3 reads unset)"),
            std::string::npos)
      << s.message();
}

// Every variable that the CPU engine, the links and the host transports read is either compared
// across ranks (kHostSettingNames) or named here as acting on one rank alone, so that a new
// threshold cannot join without a decision; and every compared name is still read somewhere.
TEST(PeerInfo, EveryHostVariableIsComparedOrActsOnOneRankAlone) {
  const std::set<std::string> oneRank = {"TUTTI_TIMEOUT",
                                         "TUTTI_SPIN_NS",
                                         "TUTTI_EXCHANGE",
                                         "TUTTI_EXCHANGE_RECHECK",
                                         "TUTTI_STATE_BROADCAST_RECHECK",
                                         "TUTTI_SHM_SINGLE_COPY",
                                         "TUTTI_SHM_SLOW_GBPS",
                                         "TUTTI_SHM_SINGLE_COPY_MIN",
                                         "TUTTI_TCP_DIRECT",
                                         "TUTTI_STREAM_COPY_MIN"};
  const std::set<std::string> compared(tutti::kHostSettingNames,
                                       tutti::kHostSettingNames + tutti::HostSettings::kCount);
  EXPECT_EQ(compared.size(), size_t(tutti::HostSettings::kCount)) << "a name is listed twice";
  std::set<std::string> read;
  const std::regex name("\"((NCCL|TUTTI)_[A-Z0-9_]+)");
  for (const char* file :
       {"runtime/engine.cc", "runtime/engine_area.cc", "runtime/engine_choice.cc",
        "runtime/engine_config.cc", "runtime/links.cc", "transports/shm/shm.cc",
        "transports/shm/area.cc", "transports/tcp/tcp.cc", "kernels/cpu/ring_dispatch.cc",
        "kernels/cpu/area_bcast.cc", "kernels/cpu/simd.cc"}) {
    std::ifstream in(std::string(TUTTI_SOURCE_DIR) + "/" + file);
    ASSERT_TRUE(in) << file;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (std::sregex_iterator it(text.begin(), text.end(), name), end; it != end; ++it) {
      const std::string v = (*it)[1];
      read.insert(v);
      EXPECT_TRUE(compared.count(v) || oneRank.count(v))
          << file << " reads " << v
          << ": add it to kHostSettingNames (runtime/host_settings.cc) if every rank must read it "
             "alike, else to the list above";
    }
  }
  for (const std::string& v : compared) EXPECT_TRUE(read.count(v)) << v << " is read nowhere";
}

// Two ranks use one GPU when they are GPU ranks of one host with the same bus id and UUID: MIG
// instances of one GPU share the bus id but not the UUID (they reach each other only through
// host memory, and do not share SMs).
TEST(PeerInfo, SameGpuMeansTheSameBusIdAndUuidOnOneHost) {
  PeerInfo a{}, b{};
  a.cudaDev = b.cudaDev = 0;
  a.hostHash = b.hostHash = 7;
  snprintf(a.busId, sizeof(a.busId), "0000:3b:00.0");
  snprintf(b.busId, sizeof(b.busId), "0000:3b:00.0");
  a.gpuUuid[0] = b.gpuUuid[0] = 0x42;
  EXPECT_TRUE(tutti::sameGpu(a, b));
  b.gpuUuid[15] = 1;  // another MIG instance of the same GPU
  EXPECT_FALSE(tutti::sameGpu(a, b));
  PeerInfo unknown = b;  // a UUID that could not be read: the bus id alone decides
  memset(unknown.gpuUuid, 0, sizeof(unknown.gpuUuid));
  EXPECT_TRUE(tutti::sameGpu(a, unknown));
  b.gpuUuid[15] = 0;
  b.hostHash = 8;  // another host
  EXPECT_FALSE(tutti::sameGpu(a, b));
  b.hostHash = 7;
  b.cudaDev = -1;  // a CPU rank
  EXPECT_FALSE(tutti::sameGpu(a, b));
}

// The collectives' channels per GPU rank: half of the GPU's multiprocessors (at most 64),
// divided among the ranks on it, the least over the communicator's GPUs, so that every rank
// plans alike. A MIG slice or a small GPU gets fewer than an H100; CPU ranks do not count.
TEST(PeerInfo, ChannelsFollowTheSmallestShareOfAGpu) {
  auto gpu = [](uint64_t host, const char* bus, int sms) {
    PeerInfo p{};
    p.cudaDev = 0;
    p.hostHash = host;
    snprintf(p.busId, sizeof(p.busId), "%s", bus);
    p.gpuUuid[0] = uint8_t(bus[5]);
    p.gpuSms = sms;
    return p;
  };
  auto cap = [](const std::vector<PeerInfo>& peers) {
    return tutti::deviceChannelCap(peers.data(), peers.size());
  };
  const PeerInfo h100 = gpu(1, "0000:1b:00.0", 132), slice = gpu(1, "0000:2c:00.0", 60);
  EXPECT_EQ(cap({h100}), 64);                       // one rank: 64 blocks (16 channels at most)
  EXPECT_EQ(cap({h100, h100, h100, h100}), 16);     // 4 ranks share 64, as before
  EXPECT_EQ(cap({slice, slice, slice, slice}), 7);  // 30 blocks among 4 (a 3g MIG slice)
  EXPECT_EQ(cap({h100, h100, slice}), 30);          // the slice alone: 30; the H100's two: 32
  EXPECT_EQ(cap({gpu(1, "0000:3d:00.0", 16), gpu(1, "0000:3d:00.0", 16)}), 4);  // 1g: 8 / 2
  PeerInfo unknown = h100;  // a size that could not be read: 64, as before
  unknown.gpuSms = 0;
  EXPECT_EQ(cap({unknown, unknown}), 32);
  EXPECT_EQ(cap({gpu(1, "0000:4e:00.0", 1)}), 1);  // never 0
  PeerInfo cpu{};
  cpu.cudaDev = -1;
  EXPECT_EQ(cap({cpu, cpu}), tutti::kSharedGpuBlocks);  // no GPU rank: nothing to share
  EXPECT_EQ(cap({cpu, slice, slice}), 15);
}
