[inputs: ["{mix,.formatter}.exs", "{lib,test,bench}/**/*.{ex,exs}"]]
