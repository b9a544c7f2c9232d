// What ina-ctl prints for people (tables on a terminal): the controller's JSON and admission
// answers turned into aligned text. Pure: JSON or text in, text out (tests/controller).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ina::ctl {

// Rows of cells as an aligned table: a header row, then the rows; columns separated by two
// spaces, the last column not padded.
std::string format_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows);

// GET /v1/aggregators as a table: ID, ADDRESS, STATE, FREE/SLOTS, FAN-IN, BLOCK, HEARTBEAT, JOBS.
std::string aggregators_table(const nlohmann::json& aggregators);
// GET /v1/jobs as a table: ID, NAME, WORLD, STATE, SHAPE, PLACEMENT, IDLE, REASON.
std::string jobs_table(const nlohmann::json& jobs);
// GET /v1/jobs/ID: the job's fields, then its placements as a table.
std::string job_details(const nlohmann::json& job);

// The admission answer ("admitted"/"refused" then "key value" lines, requests.h) as fields;
// "result" holds the first line. Empty when `text` is not such an answer.
nlohmann::json admission_json(const std::string& text);
// One sentence for a person: "admitted: job 3 on 10.0.0.1:47474, slots 128, block 2048" or
// "refused: job 4: every aggregator is draining (its ranks run on the host path)".
std::string admission_summary(const nlohmann::json& admission);

// The error of a failed request for a person: the "error" of a JSON body, the text after
// "error " of a text body, else the body itself (trimmed), else "HTTP <status>".
std::string error_text(int status, const std::string& body);

}  // namespace ina::ctl
