"""The command line's help texts: the questions' shape, the exit codes, each command's
examples."""

from __future__ import annotations

__all__ = ["EXAMPLES", "EXIT_CODES", "QUESTIONS_SHAPE"]

QUESTIONS_SHAPE = """\
--questions FILE is a JSON object of question id to question, or that object under a
"questions" key; a question is one of
  {"type": "noul", "instructions": "Is a refund requested?"}
  {"type": "choice", "instructions": "Which team?",
   "criteria": {"billing": "money matters", "shipping": null}}   (or a list of labels)
  {"type": "score", "instructions": "How urgent?", "criteria": ["can wait", "today"]}
e.g. {"questions": {"refund": {"type": "noul", "instructions": "Is a refund requested?"}}}.
An id may be given once, across --questions, --noul, --choice and --score."""

EXIT_CODES = """\
exit codes: 0 done; 1 a batch had records that failed (each has an error line); 2 the command
failed (one line on stderr, starting "typevet-async: "); 130 interrupted."""

EXAMPLES = {
    "judge": f"""example:
  typevet-async judge "I was charged twice and want a refund" \\
      --noul refund="Is a refund requested?" \\
      --choice route="Which team?:billing,shipping,technical" \\
      --score urgency="How urgent?:can wait,this week,today" --table
  echo '{{"ticket": "..."}}' | typevet-async judge - --questions questions.json
  typevet-async judge @@home --noul q="..."    # judges the literal text "@home"

{QUESTIONS_SHAPE}

{EXIT_CODES}""",
    "batch": f"""example:
  typevet-async batch tickets.jsonl --questions questions.json --out answers.jsonl
  typevet-async batch tickets.jsonl --questions questions.json --out answers.jsonl --resume
  zcat tickets.jsonl.gz | typevet-async batch - --questions questions.json --out answers.jsonl

input lines: {{"id": "t1", "state": "..."}}, or any other JSON value: a bare state whose id is
its line number. Blank lines are skipped. Ids must be unique (compared as JSON: 5, 5.0 and "5"
are three ids; a bare state on line 5 has the id 5).
output lines, one per input line, in input order:
  {{"id": ..., "answers": {{...}}, "usage": {{...}}}}
  {{"id": ..., "error": {{"type": ..., "message": ...}}}}   (the record failed; the batch goes on)
A line that is not JSON, or repeats an earlier id, gets an error line naming its line number:
  {{"id": 7, "error": {{"type": "InvalidInputError", "message": "line 7: not valid JSON ..."}}}}
--resume skips the records --out already has (a last line cut short by a kill is judged
again); --out must not be the input.

{QUESTIONS_SHAPE}

{EXIT_CODES}""",
    "eval": f"""example (the shipped labelled set, on the embedded server's local model):
  typevet-async eval examples/eval/tickets.jsonl --questions examples/eval/questions.json \\
      --out eval-report
  typevet-async calibrate eval-report --out calibration.json
  typevet-async batch tickets.jsonl --questions examples/eval/questions.json \\
      --out answers.jsonl --calibration calibration.json

input lines: {{"id": "e001", "state": "...", "labels": {{"refund": true, "route": "billing",
"urgency": 2}}}}: a Noul's label is true or false, a Choice's one of its labels, a Score's
its 0-based level; a question left out of "labels" is not scored for that record. Every line is
checked before the first record is sent. Ids must be unique.
--out DIR gets reads.jsonl (each record's probabilities, raw probabilities and rotations, with
its labels, appended as judged; --resume continues it), report.json, report.html and, per
question, QUESTION-reliability.png and QUESTION-confidence.png. --permutations K adds the
order sensitivity (flip rate, largest probability change) to the report.

{QUESTIONS_SHAPE}

{EXIT_CODES}""",
    "calibrate": f"""example:
  typevet-async calibrate eval-report --out calibration.json --holdout 0.3

Fits, per question, a temperature (on the question, and on every question of its type), Platt
scaling and isotonic regression on the raw probabilities of eval's reads outside the held-out
split (by a hash of each id), and keeps the one with the lowest held-out NLL only if it beats
the raw probabilities there. The map is pinned to the question set, model, template family,
server kind and reading (permutations, label prior) of the eval run: --calibration refuses it
anywhere else.

{EXIT_CODES}""",
    "fit-prior": f"""example (a batch's input, or eval's with its labels unread):
  typevet-async fit-prior tickets.jsonl --questions questions.json --out prior.json
  typevet-async batch more-tickets.jsonl --questions questions.json --out answers.jsonl \\
      --prior prior.json

input lines: {{"id": "t1", "state": "..."}} (other keys, such as "labels", are not read), or
any other JSON value: a bare state. Blank lines are skipped; every line is checked before the
first record is sent. Judges every state as batch does, without a map, a prior or the off-menu
guard, and keeps each question's mean answer (batch calibration's prior): a question the
states do not vary, or fewer than 16 states (2 per option if more), gets none, and its answers
are left as read. The prior is pinned to the question set, model, template family, server
kind, prompt framing and reading (permutations, label prior) of this run: --prior refuses it
anywhere else, and with --calibration or --content-free on the same question.

{QUESTIONS_SHAPE}

{EXIT_CODES}""",
    "generate": f"""example (examples/ticket.schema.json: a closed object of enums and a short
string, which the bundled 270M model fills in; an open schema lets it invent keys until
--max-tokens):
  typevet-async generate "Sort this support ticket. Ticket: I was charged twice for \\
      my order and want my money back." --schema examples/ticket.schema.json --max-tokens 100

{EXIT_CODES}""",
    "serve": """example:
  echo "$(openssl rand -hex 24)" > keys.txt
  typevet-async serve --port 8000 --keys-file keys.txt
  curl -s localhost:8000/v1/systemone -H "Authorization: Bearer $(cat keys.txt)" \\
      -d '{"model": "m", "state": "Charged twice",
           "questions": {"refund": {"type": "noul", "instructions": "Refund?"}}}'
Routes: POST /v1/systemone, GET /v1/models (key required when keys are configured);
GET /healthz, /readyz, /metrics (no key). No keys configured: auth is off (logged as a warning).
SIGTERM or Ctrl-C stops accepting, lets in-flight requests finish, then closes the session.

exit codes: 0 stopped by SIGTERM or Ctrl-C; 2 it could not start (a port in use, an unreadable
--keys-file, a bad flag): one line on stderr, starting "typevet-async: ".""",
    "mcp": """example: an MCP client's entry for this server (Claude Desktop's
claude_desktop_config.json; other clients that start stdio servers take the same command):
  {"mcpServers": {"typevet": {"command": "typevet-async",
      "args": ["mcp", "--base-url", "http://127.0.0.1:8080"]}}}
Without --base-url (or TYPEVET_BASE_URL) the embedded llama.cpp server starts with a local
model (--local-model or TYPEVET_LOCAL_MODEL; about 10 s) and stops with this server.
Tools: ask_noul(state, instructions), ask_choice(state, instructions, options),
ask_score(state, instructions, levels), ask(state, questions) with System One questions.
A bad question or a failing model server is a tool error result; the server goes on.
stdout carries only the protocol; logs go to stderr. Closing stdin, SIGTERM or Ctrl-C stops
the server; the session (and an embedded server) is closed first.

exit codes: 0 the client closed stdin, or SIGTERM; 2 it could not start (a bad flag, the
embedded server did not start, the mcp extra is missing): one line on stderr, starting
"typevet-async: "; 130 interrupted (Ctrl-C).""",
    "serve-local": """example:
  typevet-async serve-local --port 8080
  typevet-async serve-local --model qwen2.5-coder-1.5b   (a real instruction model)
  TYPEVET_BASE_URL=http://127.0.0.1:8080 typevet-async judge "..." --noul q="Refund?"
In Python, Session.local(server=tv.ServerOptions(n_ctx=16384, n_parallel=4)) starts the same
server for one session (on a free port).

exit codes: 0 stopped by Ctrl-C; 2 it could not start (a port in use, a missing --model file,
an unknown model name, a corrupt model package, a bad flag): one line on stderr, starting
"typevet-async: ".""",
}
