// Renders a chat template with Hugging Face's JavaScript Jinja engine,
// @huggingface/jinja (the one transformers.js renders chat templates with).
//
// Run by tests/helpers/jinja_engines.py with node; the package is the one
// tests/run installs into the folder named by XTML_HFJINJA (the folder that
// holds node_modules). Reads one JSON job on stdin, writes one JSON answer on
// stdout:
//
//   job:    {"template": text,
//            "requests": [{"messages": [...], "tools": [...] (optional),
//                          "add_generation_prompt": bool, ...more template variables}, ...]}
//   answer: [{"text": rendered} or {"error": message}, ...], one per request
//
// Each request is rendered as transformers.js's apply_chat_template renders
// (PreTrainedTokenizer.apply_chat_template: `compiledTemplate.render({messages,
// add_generation_prompt, tools, documents, ...special_tokens_map,
// ...kwargs})`, where tools and documents default to null): tools null when
// the request has none, documents null, bos_token and eos_token "" (as the
// other engines of the harness get them), the other keys as they are.
//
// raise_exception is the package's own: setupGlobals (src/runtime.ts) declares
// `raise_exception(args) { throw new Error(args) }`, so the message arrives
// as the Error's message, unchanged. A request may not pass a variable of its
// own by that name (nor range, strftime_now, true/false/none): the
// environment refuses it ("Variable already declared").
//
// What JSON.parse does to the values before the template sees them (checked
// with node 20 and this package): an integer beyond 2**53 loses precision
// (9007199254740993 arrives as 9007199254740992); a float with no fraction is
// a JS integer, which the package makes an IntegerValue (1.0 renders "1",
// and -0.0 renders "0", where Python renders "1.0" and "-0.0"); the keys of
// an object that look like array indices ("2", "10") come first, in numeric
// order, before the other keys in their order (so `{"b":1,"10":2,"2":3}`
// iterates and tojsons as 2, 10, b). Besides (the engine, not JSON): null and
// undefined render as "" where Python renders "None", booleans as "true" and
// "false" where Python renders "True" and "False", and an object or a list as
// JSON (`{"a": 1}`) where Python renders its repr (`{'a': 1}`).

import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const home = process.env.XTML_HFJINJA;
if (!home) {
    process.stderr.write("XTML_HFJINJA is not set (the folder holding node_modules/@huggingface/jinja)\n");
    process.exit(2);
}
const { Template } = createRequire(join(home, "package.json"))("@huggingface/jinja");

function message(e) {
    return e instanceof Error ? e.message : String(e);
}

const job = JSON.parse(readFileSync(0, "utf8"));
let template = null;
let parseError = null;
try {
    template = new Template(job.template);
} catch (e) {
    parseError = message(e);
}

const answer = job.requests.map((request) => {
    if (parseError !== null) {
        return { error: parseError };
    }
    const { messages, tools, add_generation_prompt, ...kwargs } = request;
    try {
        const text = template.render({
            messages,
            add_generation_prompt: add_generation_prompt ?? false,
            tools: tools ?? null,
            documents: null,
            bos_token: "",
            eos_token: "",
            ...kwargs,
        });
        return { text };
    } catch (e) {
        return { error: message(e) };
    }
});
process.stdout.write(JSON.stringify(answer));
