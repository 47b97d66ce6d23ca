#include "lengths_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>

namespace rlsched::app {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The message of the std::invalid_argument that parsing `text` throws.
std::string ParseError(const std::string& text, std::int64_t max_lengths = balance::kMaxItems) {
  try {
    ParseLengths(text, max_lengths);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no std::invalid_argument for input:\n" << text;
  return "";
}

TEST(LengthsReaderTest, LongLinesAreRefusedAtTheBound) {
  // A line of kMaxLineBytes is read; one byte more is refused, naming the line.
  std::string text = "7\n" + std::string(kMaxLineBytes - 1, ' ') + "5\n9";
  EXPECT_THAT(ParseLengths(text).lengths, ElementsAre(7, 5, 9));
  text = "7\n" + std::string(kMaxLineBytes, ' ') + "5\n9";
  EXPECT_THAT(ParseError(text), HasSubstr("line 2: longer than 16777216 bytes"));
  // A NUL-filled "line" (a device read by mistake) stops at the bound too.
  EXPECT_THAT(ParseError(std::string(kMaxLineBytes + 10, '\0')), HasSubstr("line 1: longer than"));
}

TEST(LengthsReaderTest, NumbersGoneWrongAreNotAHeader) {
  // A first line with a letter inside a number is not taken for a CSV header.
  EXPECT_THAT(ParseError("0x10\n5\n"), HasSubstr("line 1: '0x10' is not an integer"));
  EXPECT_THAT(ParseError("1e3 7\n"), HasSubstr("line 1: '1e3' is not an integer"));
  EXPECT_THAT(ParseLengths("\"length\"\n4\n").lengths, ElementsAre(4));
  EXPECT_THAT(ParseLengths("id, length\n7, 4\n").lengths, ElementsAre(4));
}

TEST(LengthsReaderTest, ErrorsEchoAtMost80Bytes) {
  const std::string token(1000, '9');
  const std::string junk = "1" + std::string(1000, 'x');
  for (const std::string& text :
       {token + "\n", junk + "\n", "length\n" + junk + "\n", "length,group\n5," + token + "\n"}) {
    const std::string error = ParseError(text);
    EXPECT_LT(error.size(), 200u) << error;
    EXPECT_THAT(error, HasSubstr("…")) << error;
  }
}

TEST(LengthsReaderTest, OnePerLine) {
  const LengthsInput input = ParseLengths("100\n200\n300\n");
  EXPECT_THAT(input.lengths, ElementsAre(100, 200, 300));
  EXPECT_THAT(input.groups, IsEmpty());
}

TEST(LengthsReaderTest, WhitespaceSeparated) {
  EXPECT_THAT(ParseLengths("1 2\t3\n  4   5  \n6").lengths, ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST(LengthsReaderTest, BlankLinesCrLfAndByteOrderMark) {
  EXPECT_THAT(ParseLengths("\xEF\xBB\xBF\r\n7\r\n\r\n  \n8\r\n").lengths, ElementsAre(7, 8));
}

TEST(LengthsReaderTest, BoundsAreInclusive) {
  EXPECT_THAT(ParseLengths("0\n2147483648\n").lengths, ElementsAre(0, 2147483648));
}

TEST(LengthsReaderTest, CsvPromptPlusResponseWithGroups) {
  const LengthsInput input =
      ParseLengths("group,prompt_tokens,response_tokens\n0,72,170\n0,72,193\n1,50,5\n");
  EXPECT_THAT(input.lengths, ElementsAre(242, 265, 55));
  EXPECT_THAT(input.groups, ElementsAre(0, 0, 1));
}

TEST(LengthsReaderTest, CsvWithoutGroups) {
  const LengthsInput input = ParseLengths("prompt_tokens,response_tokens\n484,23189\n438,6208\n");
  EXPECT_THAT(input.lengths, ElementsAre(23673, 6646));
  EXPECT_THAT(input.groups, IsEmpty());
}

TEST(LengthsReaderTest, CsvLengthOrTokensColumn) {
  EXPECT_THAT(ParseLengths("id,length\na,10\nb,20\n").lengths, ElementsAre(10, 20));
  EXPECT_THAT(ParseLengths("tokens\n5\n6\n").lengths, ElementsAre(5, 6));
  // `length` wins over `tokens`; prompt + response over both.
  EXPECT_THAT(ParseLengths("tokens,length\n1,2\n").lengths, ElementsAre(2));
  EXPECT_THAT(ParseLengths("length,prompt_tokens,response_tokens\n1,2,3\n").lengths,
              ElementsAre(5));
}

TEST(LengthsReaderTest, CsvResponseColumnAlone) {
  const std::string csv = "group,length,prompt_tokens,response_tokens\n0,9,72,170\n1,9,50,5\n";
  const LengthsInput input = ParseLengths(csv, balance::kMaxItems, LengthColumn::kResponse);
  EXPECT_THAT(input.lengths, ElementsAre(170, 5));
  EXPECT_THAT(input.groups, ElementsAre(0, 1));
  // Without response_tokens, as for whole sequences; plain integers as they are.
  EXPECT_THAT(ParseLengths("length\n7\n", balance::kMaxItems, LengthColumn::kResponse).lengths,
              ElementsAre(7));
  EXPECT_THAT(ParseLengths("3 4\n", balance::kMaxItems, LengthColumn::kResponse).lengths,
              ElementsAre(3, 4));
}

TEST(LengthsReaderTest, CsvNamesQuotesAndSpaces) {
  const LengthsInput input = ParseLengths(
      " Group , \"Length\" ,note\r\n3, 40 ,\"a, \"\"quoted\"\" note\"\n\n4,\"50\",x\n");
  EXPECT_THAT(input.lengths, ElementsAre(40, 50));
  EXPECT_THAT(input.groups, ElementsAre(3, 4));
}

TEST(LengthsReaderTest, CsvHeaderOnlyHasNoLengths) {
  EXPECT_EQ(ParseError("length\n"), "no lengths");
}

TEST(LengthsReaderTest, EmptyInputIsAnError) {
  EXPECT_EQ(ParseError(""), "no lengths");
  EXPECT_EQ(ParseError(" \n\t\n\n"), "no lengths");
}

TEST(LengthsReaderTest, NonIntegerNamesTheLine) {
  EXPECT_EQ(ParseError("1\n2\n3 x4\n"), "line 3: 'x4' is not an integer");
  EXPECT_EQ(ParseError("1.5\n"), "line 1: '1.5' is not an integer");
  EXPECT_EQ(ParseError("+3\n"), "line 1: '+3' is not an integer");
  EXPECT_EQ(ParseError("1\n2\nabc\n"), "line 3: 'abc' is not an integer");
}

TEST(LengthsReaderTest, NegativeNamesTheBound) {
  EXPECT_EQ(ParseError("5\n-3\n"), "line 2: length -3 must be in [0, 2147483648]");
}

TEST(LengthsReaderTest, TooLongNamesTheBound) {
  EXPECT_EQ(ParseError("2147483649\n"), "line 1: length 2147483649 must be in [0, 2147483648]");
  EXPECT_EQ(ParseError("\n99999999999999999999999\n"),
            "line 2: length 99999999999999999999999 must be in [0, 2147483648]");
}

TEST(LengthsReaderTest, TooManyEntries) {
  EXPECT_THAT(ParseLengths("1 2 3", 3).lengths, ElementsAre(1, 2, 3));
  EXPECT_EQ(ParseError("1 2\n3\n4\n", 3), "line 3: more than 3 lengths");
  EXPECT_EQ(ParseError("length\n1\n2\n", 1), "line 3: more than 1 lengths");
}

TEST(LengthsReaderTest, CsvMissingColumn) {
  EXPECT_THAT(ParseError("group,prompt_tokens\n0,5\n"),
              HasSubstr("line 1: the header has no length column"));
  EXPECT_THAT(ParseError("\n\nfoo,bar\n1,2\n"), HasSubstr("line 3: the header has no length"));
}

TEST(LengthsReaderTest, CsvDuplicateColumn) {
  EXPECT_EQ(ParseError("length,LENGTH\n1,2\n"), "line 1: duplicate column 'length'");
}

TEST(LengthsReaderTest, CsvWrongFieldCount) {
  EXPECT_EQ(ParseError("group,length\n0,1\n0\n"),
            "line 3: expected 2 fields (as in the header), got 1");
  EXPECT_EQ(ParseError("group,length\n0,1,2\n"),
            "line 2: expected 2 fields (as in the header), got 3");
}

TEST(LengthsReaderTest, CsvBadCells) {
  EXPECT_EQ(ParseError("group,length\n0,abc\n"),
            "line 2: column 'length': 'abc' is not an integer");
  EXPECT_EQ(ParseError("group,length\n0,\n"), "line 2: column 'length': '' is not an integer");
  EXPECT_EQ(ParseError("group,length\nx,5\n"), "line 2: column 'group': 'x' is not an integer");
  EXPECT_EQ(ParseError("group,length\n-1,5\n"), "line 2: group -1 must be >= 0");
  EXPECT_EQ(ParseError("length\n-5\n"), "line 2: length -5 must be in [0, 2147483648]");
  EXPECT_EQ(ParseError("prompt_tokens,response_tokens\n1,-5\n"),
            "line 2: response_tokens -5 must be in [0, 2147483648]");
  EXPECT_EQ(ParseError("prompt_tokens,response_tokens\n2147483648,1\n"),
            "line 2: length (prompt_tokens + response_tokens) 2147483649 must be in "
            "[0, 2147483648]");
  EXPECT_EQ(ParseError("length\n1\n\"2\n"), "line 3: unterminated quoted field");
}

std::filesystem::path DataPath(const std::string& name) {
  return std::filesystem::path(RLSCHED_TEST_DATA_DIR) / name;
}

TEST(LengthsReaderTest, SharedGrpoRollouts) {
  const auto path = DataPath("rollout_lengths_amc23_llama3b.csv");
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing (tests/data)";
  std::ifstream file(path);
  const LengthsInput input = ReadLengths(file);
  ASSERT_EQ(input.lengths.size(), 2000u);
  ASSERT_EQ(input.groups.size(), 2000u);
  EXPECT_EQ(input.lengths[0], 72 + 170);
  EXPECT_EQ(std::set<std::int64_t>(input.groups.begin(), input.groups.end()).size(), 40u);
}

TEST(LengthsReaderTest, SharedReasoningLengths) {
  const auto path = DataPath("reasoning_lengths_intellect3_math.csv");
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing (tests/data)";
  std::ifstream file(path);
  const LengthsInput input = ReadLengths(file);
  ASSERT_EQ(input.lengths.size(), 42u);
  EXPECT_THAT(input.groups, IsEmpty());
  EXPECT_EQ(input.lengths[0], 484 + 23189);
}

}  // namespace
}  // namespace rlsched::app
