package controller

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"

	"kvtier/router/api"
)

// completionRequest is a client's /v1/completions or /v1/chat/completions
// body, decoded only as far as the proxy needs: every field is kept as
// the client wrote it and passed on to the engines, except the few the
// two stages change.
type completionRequest struct {
	fields map[string]json.RawMessage
	model  string
	stream bool
}

// parseCompletion decodes a request body. It refuses what is not one JSON
// object, and a model or stream of the wrong type, since the proxy reads
// both; every other field is the engine's to judge.
func parseCompletion(body []byte) (*completionRequest, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, fmt.Errorf("the body is not a JSON object: %w", err)
	}
	if fields == nil {
		return nil, errors.New("the body is not a JSON object: null")
	}
	r := &completionRequest{fields: fields}
	if raw, ok := fields["model"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &r.model); err != nil {
			return nil, fmt.Errorf("model: want a string, got %.100s", raw)
		}
	}
	if raw, ok := fields["stream"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &r.stream); err != nil {
			return nil, fmt.Errorf("stream: want true or false, got %.100s", raw)
		}
	}
	return r, nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// Fixed JSON values of the prefill request.
var (
	jsonOne   = json.RawMessage("1")
	jsonFalse = json.RawMessage("false")
)

// producerParams is what the prefill request's kv_transfer_params carry:
// vLLM's flag that another instance decodes, and kvtier's transfer id and
// the decode instance's daemon, where the producer pushes the KV.
type producerParams struct {
	DoRemoteDecode bool   `json:"do_remote_decode"`
	TransferID     string `json:"kvtier_transfer_id"`
	PushTo         string `json:"kvtier_push_to"`
}

// prefillBody is the request for the prefill stage: the client's request
// computing one token, not streamed, with the producer's transfer params.
// min_tokens and min_completion_tokens go, since they would contradict
// max_tokens 1, and stream_options, which apply only to a stream.
func (r *completionRequest) prefillBody(transferID, pushTo string) ([]byte, error) {
	params, err := json.Marshal(producerParams{DoRemoteDecode: true, TransferID: transferID, PushTo: pushTo})
	if err != nil {
		return nil, err
	}
	set := []field{{"max_tokens", jsonOne}, {"stream", jsonFalse}, {"kv_transfer_params", params}}
	if _, ok := r.fields["max_completion_tokens"]; ok {
		set = append(set, field{"max_completion_tokens", jsonOne})
	}
	return appendObject(nil, r.fields, set, "stream_options", "min_tokens", "min_completion_tokens"), nil
}

// decodeBody is the request for the decode stage: the client's request as
// it came, with the kv_transfer_params the prefill instance answered
// (none when it answered none: the decode instance then computes the
// prompt itself). A client's own kv_transfer_params are never passed on;
// the proxy owns that field.
func (r *completionRequest) decodeBody(kv json.RawMessage) ([]byte, error) {
	if len(kv) == 0 || isNull(kv) {
		return appendObject(nil, r.fields, nil, "kv_transfer_params"), nil
	}
	if !json.Valid(kv) {
		return nil, errors.New("kv_transfer_params: not valid JSON")
	}
	return appendObject(nil, r.fields, []field{{"kv_transfer_params", kv}}), nil
}

// field is one member of a JSON object.
type field struct {
	key   string
	value json.RawMessage
}

// appendObject writes fields as a JSON object, keys in order, with set's
// values in place of fields' (or added) and the keys of drop left out.
// The values are written as they are: they were decoded from JSON (or
// checked) and so are valid. It spares encoding/json's reflection, which
// allocates per member.
func appendObject(dst []byte, fields map[string]json.RawMessage, set []field, drop ...string) []byte {
	keys := make([]string, 0, len(fields)+len(set))
	for k := range fields {
		if !slices.Contains(drop, k) && !slices.ContainsFunc(set, func(f field) bool { return f.key == k }) {
			keys = append(keys, k)
		}
	}
	for _, f := range set {
		keys = append(keys, f.key)
	}
	slices.Sort(keys)
	dst = append(dst, '{')
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, k)
		dst = append(dst, ':')
		v := fields[k]
		if j := slices.IndexFunc(set, func(f field) bool { return f.key == k }); j >= 0 {
			v = set[j].value
		}
		dst = append(dst, v...)
	}
	return append(dst, '}')
}

// appendJSONString appends s as a JSON string. s is valid UTF-8 (it was
// decoded from JSON), so only quotes, backslashes and control characters
// need escaping.
func appendJSONString(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// scoreRequest is the prompt of a completion request as the score API
// takes it, and whether there is one to score: a string (tokenized with
// the model's tokenizer and, as vLLM does unless the request says
// otherwise, its special tokens) or token ids, alone or as a batch of
// one. A chat request's prompt is what the engine's chat template makes
// of the messages, which the controller cannot render; it is not scored.
func (r *completionRequest) scoreRequest(chat bool) (api.ScoreRequest, bool) {
	req := api.ScoreRequest{Model: r.model}
	raw, ok := r.fields["prompt"]
	if chat || r.model == "" || !ok {
		return req, false
	}
	if raw, ok := r.fields["cache_salt"]; ok && !isNull(raw) {
		if json.Unmarshal(raw, &req.CacheSalt) != nil {
			return req, false
		}
	}
	if tokens, ok := tokenIDs(raw); ok {
		req.Tokens = tokens
		return req, true
	}
	if one, ok := batchOfOne(raw); ok {
		raw = one
		if tokens, ok := tokenIDs(raw); ok {
			req.Tokens = tokens
			return req, true
		}
	}
	var text string
	if json.Unmarshal(raw, &text) != nil {
		return req, false
	}
	req.Prompt = &text
	req.AddSpecialTokens = true
	if raw, ok := r.fields["add_special_tokens"]; ok && !isNull(raw) {
		if json.Unmarshal(raw, &req.AddSpecialTokens) != nil {
			return req, false
		}
	}
	return req, true
}

// batchOfOne returns the only element of a JSON array of one. A longer
// array is not split into its elements (a batch of many prompts, or of
// token ids, is not scored anyway).
func batchOfOne(raw json.RawMessage) (json.RawMessage, bool) {
	var one [1]json.RawMessage
	if json.Unmarshal(raw, &one) != nil || one[0] == nil {
		return nil, false
	}
	// An array of more than one element decodes into [1] too, dropping
	// the rest: a second decode into an array of two tells them apart.
	var two [2]json.RawMessage
	if json.Unmarshal(raw, &two) != nil || two[1] != nil {
		return nil, false
	}
	return one[0], true
}

// tokenIDs decodes a non-empty array of token ids.
func tokenIDs(raw json.RawMessage) ([]uint32, bool) {
	var ids []int64
	if json.Unmarshal(raw, &ids) != nil || len(ids) == 0 {
		return nil, false
	}
	out := make([]uint32, len(ids))
	for i, id := range ids {
		if id < 0 || id > math.MaxUint32 {
			return nil, false
		}
		out[i] = uint32(id)
	}
	return out, true
}

// producerAnswer is the part of the prefill instance's answer the proxy
// reads: the params its KV connector returned for the decode side.
type producerAnswer struct {
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}
