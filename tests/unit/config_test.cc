// The ncclConfig_t ABI rule: size-limited copy, magic check, version-gated fields.
#include "bindings/c/config.h"

#include <gtest/gtest.h>

#include <cstring>

#include "harness/harness.h"

using tutti::CommConfig;
using tutti::api::parseConfig;
using tutti::test::ScopedEnv;

TEST(Config, NullConfigUsesEnvironmentDefaults) {
  ScopedEnv blocking("NCCL_COMM_BLOCKING", "0");
  auto c = parseConfig(nullptr, nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c.value().blocking);
}

TEST(Config, NullConfigInheritsParent) {
  CommConfig parent;
  parent.blocking = false;
  parent.commName = "parent";
  auto c = parseConfig(nullptr, &parent);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c.value().blocking);
  EXPECT_EQ(c.value().commName, "parent");
}

TEST(Config, BadMagicAndSizeAreRejected) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.magic = 0x12345678;
  auto r = parseConfig(&c, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), tutti::Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("magic"), std::string::npos);

  ncclConfig_t small = NCCL_CONFIG_INITIALIZER;
  small.size = 4;
  r = parseConfig(&small, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("size"), std::string::npos);
}

TEST(Config, FieldsAreReadAndValidated) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  c.minCTAs = 2;
  c.maxCTAs = 8;
  c.commName = "trainer";
  c.netName = "Socket";
  auto r = parseConfig(&c, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r.value().blocking);
  EXPECT_EQ(r.value().minCTAs, 2);
  EXPECT_EQ(r.value().maxCTAs, 8);
  EXPECT_EQ(r.value().commName, "trainer");
  EXPECT_EQ(r.value().netName, "Socket");

  c.minCTAs = 16;
  EXPECT_FALSE(parseConfig(&c, nullptr).ok());
  c.minCTAs = 2;
  c.blocking = 3;
  EXPECT_FALSE(parseConfig(&c, nullptr).ok());
}

TEST(Config, FieldsNewerThanTheCallersVersionAreIgnored) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.version = 22400;  // a 2.24 header knows nothing of trafficClass
  c.trafficClass = 5;
  auto r = parseConfig(&c, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().trafficClass, -1);
  c.version = 22500;
  r = parseConfig(&c, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().trafficClass, 5);
}

TEST(Config, OnlySizeBytesAreRead) {
  // A config from an older header is shorter: bytes past its size must not be read.
  alignas(ncclConfig_t) unsigned char raw[sizeof(ncclConfig_t)];
  memset(raw, 0x5a, sizeof(raw));  // garbage past the short struct
  ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
  size_t shortSize = offsetof(ncclConfig_t, trafficClass);
  memcpy(raw, &init, shortSize);
  auto* c = reinterpret_cast<ncclConfig_t*>(raw);
  c->size = shortSize;
  c->version = 22700;
  c->blocking = 1;
  auto r = parseConfig(c, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.value().trafficClass, -1);
  EXPECT_TRUE(r.value().commName.empty());
}
