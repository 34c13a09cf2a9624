// NCCL_DEBUG / NCCL_DEBUG_SUBSYS / NCCL_DEBUG_FILE and the NCCL line format.
#include "runtime/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "harness/harness.h"

using namespace tutti::log;
using tutti::test::ScopedEnv;

TEST(Log, ParseLevel) {
  EXPECT_EQ(parseLevel(nullptr), Level::kNone);
  EXPECT_EQ(parseLevel("VERSION"), Level::kVersion);
  EXPECT_EQ(parseLevel("warn"), Level::kWarn);
  EXPECT_EQ(parseLevel("INFO"), Level::kInfo);
  EXPECT_EQ(parseLevel("TRACE"), Level::kTrace);
  EXPECT_EQ(parseLevel("bogus"), Level::kNone);
}

TEST(Log, ParseSubsys) {
  EXPECT_EQ(parseSubsys("INIT"), static_cast<uint32_t>(kInit));
  EXPECT_EQ(parseSubsys("INIT,NET"), static_cast<uint32_t>(kInit | kNet));
  EXPECT_EQ(parseSubsys("ALL"), static_cast<uint32_t>(kAll));
  EXPECT_EQ(parseSubsys("^INIT") & kInit, 0u);
  EXPECT_NE(parseSubsys("^INIT") & kNet, 0u);
  EXPECT_EQ(parseSubsys("nosuch"), 0u);
}

TEST(Log, FileNamePattern) {
  EXPECT_EQ(expandFileName("/tmp/nccl.%h.%p.log", "node1", 42), "/tmp/nccl.node1.42.log");
  EXPECT_EQ(expandFileName("100%%", "h", 1), "100%");
}

TEST(Log, LineFormatAndFiltering) {
  std::string path = "/tmp/tutti-log-test." + std::to_string(getpid()) + ".%p";
  std::string expanded = expandFileName(path, "", getpid());
  {
    ScopedEnv level("NCCL_DEBUG", "INFO");
    ScopedEnv subsys("NCCL_DEBUG_SUBSYS", "INIT");
    ScopedEnv file("NCCL_DEBUG_FILE", path.c_str());
    reinitForTest();
    setThreadDevice(3);
    TUTTI_INFO(kInit, "hello %d", 7);
    TUTTI_INFO(kNet, "filtered out");
    TUTTI_WARN("something broke");
    setThreadDevice(-1);
  }
  reinitForTest();
  std::ifstream in(expanded);
  ASSERT_TRUE(in.good()) << expanded;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  unlink(expanded.c_str());
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(^[^:. ]+:\d+:\d+ \[3\] NCCL INFO hello 7\n)")))
      << text;
  EXPECT_EQ(text.find("filtered out"), std::string::npos) << text;
  EXPECT_TRUE(std::regex_search(
      text, std::regex(R"(\n[^:. ]+:\d+:\d+ \[3\] log_test\.cc:\d+ NCCL WARN something broke\n)")))
      << text;
}
