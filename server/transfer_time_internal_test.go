package server

import (
	"testing"

	"kvtier/engine"
)

// TestTransferTimeCoversPDTimeout: engine.PushChain links a transfer's
// batches on a connection for MaxTransferTime after its first batch, so
// that must cover the longest transfer the server allows, or a long
// transfer's later batches would start chains of their own.
func TestTransferTimeCoversPDTimeout(t *testing.T) {
	if engine.MaxTransferTime < maxPDTimeout {
		t.Fatalf("engine.MaxTransferTime %v is shorter than the longest transfer, %v", engine.MaxTransferTime, maxPDTimeout)
	}
}
