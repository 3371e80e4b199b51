package chtest

import "testing"

func TestDBName(t *testing.T) {
	tests := []struct {
		test string
		want string
	}{
		{test: "TestNewDB", want: "t_testnewdb_0000abcd"},
		{test: "TestX/sub test-1", want: "t_testx_sub_test_1_0000abcd"},
		{test: "Test//__weird__", want: "t_test_weird_0000abcd"},
		{test: "/Leading", want: "t_leading_0000abcd"},
		{test: "TestAVeryLongNameThatGoesOnAndOnPastTheLimit", want: "t_testaverylongnamethatgoesonandonpastthel_0000abcd"},
		{test: "Тест", want: "t_0000abcd"},
	}
	for _, tt := range tests {
		t.Run(tt.test, func(t *testing.T) {
			if got := dbName(tt.test, 0xabcd); got != tt.want {
				t.Errorf("dbName(%q) = %q, want %q", tt.test, got, tt.want)
			}
		})
	}
}
